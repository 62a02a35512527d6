"""A multi-turn customer-service data set written by the project (no download), for p02.

A conversation has 2-3 user turns about one order: where it is (`track_order`), a refund
(`refund`) or a new delivery address (`change_address`), the intent names and opening requests
of a06's data set (`camplib.intents.phrasings`). Later turns give a missing slot ("it's order
482"), switch intent ("actually, just refund me") or add an address. After every user turn
the assistant answers with the *dialogue state*, one structured line:

    intent: refund; order: 482; product: blender; address: -

The state carries slots across turns: an order number given in turn 1 is still in turn 3's
answer, whatever the user talked about in between, so scoring per turn shows whether a model
keeps track. Everything is drawn from `random.Random(seed)`: the same seed, the same data.

The held-out split is honest about what it tests: its opening requests and follow-up phrasings
never occur in training (every fourth template held out, as in camplib.intents), and its order
numbers and addresses are fresh draws. Products come from a06's training list in both splits:
copying a product name the tokenizer has never seen is beyond the CI profile's tiny model.
"""
from __future__ import annotations

import random

from camplib.intents import phrasings, products

__all__ = ["INTENTS", "SLOTS", "EMPTY", "make_dialogues", "state_line", "parse_state", "reply"]

INTENTS = ["track_order", "refund", "change_address"]        # a06's names for the three tasks
SLOTS = ["intent", "order", "product", "address"]             # the order they are written in
EMPTY = "-"                                                   # a slot not known yet

_FOLLOW_UPS = {
    "give_order": ["it's order {order}", "the order number is {order}", "order {order}",
                   "sure, it is {order}", "my order number is {order}", "{order}"],
    "give_product": ["it was the {product}", "the {product}", "I bought a {product}",
                     "it's about the {product}"],
    "track_order": ["and where is it now?", "when will it arrive?", "can you track it for me",
                    "is it on its way?"],
    "refund": ["actually I just want a refund", "forget it, refund me instead", "I'd rather get my money back",
               "please refund it"],
    "change_address": ["also I moved, ship it to {address}", "please change the address to {address}",
                       "send it to {address} instead", "the new address is {address}"],
    "give_address": ["{address}", "it's {address}", "the new address is {address} please",
                     "ship it to {address}"],
}
_STREETS = ["Oak", "Elm", "Maple", "Pine", "Cedar", "Birch", "Hill", "Lake", "Park", "Mill", "River", "Church"]
_KINDS = ["Street", "Road", "Lane", "Avenue"]


def _pick(kind: str, rng: random.Random, held_out: bool) -> str:
    options = [t for i, t in enumerate(_FOLLOW_UPS[kind]) if (i % 4 == 3) == held_out]
    return rng.choice(options)


def state_line(state: dict) -> str:
    """The structured answer: 'intent: refund; order: 482; product: blender; address: -'."""
    return "; ".join(f"{slot}: {state.get(slot) or EMPTY}" for slot in SLOTS)


def parse_state(text: str) -> dict[str, str]:
    """The slots of a structured answer's first line ({} if it has none); unknown keys dropped,
    missing slots absent. Never raises: a model's output may be anything."""
    line = text.strip().split("\n", 1)[0] if isinstance(text, str) else ""
    state = {}
    for part in line.split(";"):
        key, sep, value = part.partition(":")
        key = key.strip()
        if sep and key in SLOTS and key not in state:
            state[key] = value.strip()
    return state


def reply(state: dict) -> str:
    """The assistant's whole message for a state: the structured line (kept to one line so that
    the CI profile's tiny model trains on short sequences)."""
    return state_line(state)


def _opening(intent: str, rng: random.Random, held_out: bool, order: str, product: str) -> tuple[str, dict]:
    """a06's request for `intent`, filled; returns it and the slots it mentions."""
    template = rng.choice(phrasings(intent, held_out))
    text = template.format(product=product, order=order, when=rng.choice(["yesterday", "last week", "on Monday"]))
    said = {"intent": intent}
    if "{order}" in template:
        said["order"] = order
    if "{product}" in template:
        said["product"] = product
    return (text.capitalize() if rng.random() < 0.5 else text), said


def _conversation(rng: random.Random, held_out: bool) -> list[dict]:
    order = str(rng.randrange(100, 1000))
    product = rng.choice(products())
    address = f"{rng.randrange(1, 99)} {rng.choice(_STREETS)} {rng.choice(_KINDS)}"
    intent = rng.choice(INTENTS)
    text, state = _opening(intent, rng, held_out, order, product)
    messages = [{"role": "user", "content": text}, {"role": "assistant", "content": reply(state)}]
    for _ in range(rng.choice([1, 2])):
        state = dict(state)
        if "order" not in state:                       # the assistant asked for it
            kind = "give_order"
        elif state["intent"] == "change_address" and "address" not in state:
            kind = "give_address"
        elif state["intent"] == "refund" and "product" not in state:
            kind = "give_product"
        else:                                          # switch to another task about the same order
            kind = rng.choice([i for i in INTENTS if i != state["intent"]])
        text = _pick(kind, rng, held_out).format(order=order, product=product, address=address)
        if kind in INTENTS:
            state["intent"] = kind
        slot = {"give_order": "order", "give_product": "product", "give_address": "address",
                "change_address": "address"}.get(kind)
        if slot:
            state[slot] = {"order": order, "product": product, "address": address}[slot]
        messages += [{"role": "user", "content": text}, {"role": "assistant", "content": reply(state)}]
    return messages


def make_dialogues(n_train: int = 400, n_test: int = 100, seed: int = 0) -> dict[str, list[list[dict]]]:
    """{"train": conversations, "test": conversations}; a conversation is a list of
    {"role": "user" | "assistant", "content": str}, alternating, starting with the user.
    Deterministic for a given seed; the test split uses phrasings never seen in training."""
    if n_train < 1 or n_test < 0:
        raise ValueError(f"need n_train >= 1 and n_test >= 0, got {n_train}, {n_test}")
    rng = random.Random(seed)
    return {"train": [_conversation(rng, False) for _ in range(n_train)],
            "test": [_conversation(rng, True) for _ in range(n_test)]}
