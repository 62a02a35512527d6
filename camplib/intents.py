"""A small labelled data set for intent classification of customer-service requests (lab a06).

Written by the project (no download): each intent has hand-written phrasings with slots
(product, order number, time...), filled at random with a seeded generator, and wrapped in a
greeting or a sign-off now and then. The held-out split is honest: it uses phrasings that never
appear in training (every fourth template of each intent) and slot values drawn from a separate
list, so a model must recognise the intent, not memorise sentences.
"""
from __future__ import annotations

import random

__all__ = ["INTENTS", "make_intent_dataset", "phrasings", "products"]

_TEMPLATES: dict[str, list[str]] = {
    "refund": [
        "I want my money back for the {product}", "how do I get a refund for order {order}",
        "please refund me, the {product} was broken", "can I return the {product} and get reimbursed",
        "when will my refund arrive", "I returned the {product} {when} and still have no refund",
        "I'd like a refund please", "give me my money back, the {product} is useless",
    ],
    "track_order": [
        "where is my order {order}", "my {product} has not arrived yet", "can you track my package",
        "when will the {product} be delivered", "what is the status of order {order}",
        "the tracking number for my {product} does not work", "is my parcel on its way",
        "it has been a week and the {product} still isn't here",
    ],
    "cancel_order": [
        "cancel my order {order}", "I don't want the {product} anymore, please cancel it",
        "how can I cancel an order", "stop the shipment of my {product}",
        "I ordered the {product} by mistake, cancel it", "please cancel the purchase I made {when}",
        "can I still cancel order {order}", "I changed my mind about the {product}, cancel please",
    ],
    "change_address": [
        "I need to change my delivery address", "ship order {order} to a different address",
        "I moved, please update my shipping address", "can the {product} go to my office instead",
        "wrong address on order {order}", "how do I edit the address for my delivery",
        "please send the {product} to my new home", "update the postcode on my order",
    ],
    "payment_problem": [
        "my card was declined", "I was charged twice for the {product}",
        "the payment for order {order} failed", "why was my credit card billed {when}",
        "I can't pay with my card", "there is a wrong charge on my bank statement",
        "the checkout keeps rejecting my payment", "I paid for the {product} but the order says unpaid",
    ],
    "account_access": [
        "I forgot my password", "I can't log in to my account", "reset my password please",
        "my account is locked", "I never got the login code", "how do I recover my account",
        "the app says my password is wrong", "I can't sign in since {when}",
    ],
    "product_info": [
        "is the {product} in stock", "what size is the {product}", "does the {product} come in black",
        "tell me more about the {product}", "is the {product} waterproof",
        "what is the warranty on the {product}", "how much does the {product} weigh",
        "when will the {product} be available again",
    ],
    "human_agent": [
        "I want to talk to a person", "let me speak to a human agent", "connect me with customer support",
        "can I call someone", "is there a real person I can chat with", "get me a manager",
        "I need to speak with an agent about order {order}", "transfer me to a representative",
    ],
}
INTENTS: list[str] = list(_TEMPLATES)

_PRODUCTS = (["blender", "laptop", "jacket", "phone case", "coffee machine", "desk lamp", "backpack",
              "headphones", "sofa", "kettle"],
             ["tent", "monitor", "sneakers", "vacuum cleaner", "watch"])          # (train, held-out)
_WHEN = (["yesterday", "last week", "on Monday", "two days ago"], ["this morning", "last month"])
_OPEN = ["", "", "", "hi, ", "hello, ", "hey, ", "good morning, "]
_CLOSE = ["", "", "", " thanks", " please", "!", "?", " asap"]


def phrasings(intent: str, held_out: bool = False) -> list[str]:
    """The request templates of `intent` ({product}, {order}, {when} slots) in one split: every
    fourth is held out. Public so that other data sets (p02's dialogues) reuse the wording."""
    if intent not in _TEMPLATES:
        raise ValueError(f"unknown intent {intent!r}; known: {INTENTS}")
    return [t for i, t in enumerate(_TEMPLATES[intent]) if (i % 4 == 3) == held_out]


def products(held_out: bool = False) -> list[str]:
    """The product names of one split (held-out products never appear in training)."""
    return list(_PRODUCTS[1 if held_out else 0])


def _fill(template: str, rng: random.Random, held_out: bool) -> str:
    pick = 1 if held_out else 0
    text = template.format(product=rng.choice(_PRODUCTS[pick]), when=rng.choice(_WHEN[pick]),
                           order=f"#{rng.randrange(10000, 99999)}")
    text = rng.choice(_OPEN) + text + rng.choice(_CLOSE)
    return text.capitalize() if rng.random() < 0.5 else text


def make_intent_dataset(n_train_per_intent: int = 40, n_test_per_intent: int = 20, seed: int = 0) -> dict:
    """{"train": (texts, labels), "test": (texts, labels), "intents": names}; labels are
    indices into `intents`. Deterministic for a given seed; train and test share no phrasing."""
    if n_train_per_intent < 1 or n_test_per_intent < 0:
        raise ValueError(f"need n_train_per_intent >= 1 and n_test_per_intent >= 0, "
                         f"got {n_train_per_intent}, {n_test_per_intent}")
    rng = random.Random(seed)
    splits = {"train": ([], []), "test": ([], [])}
    for label, intent in enumerate(INTENTS):
        train_t, test_t = phrasings(intent), phrasings(intent, held_out=True)
        for split, pool, n in (("train", train_t, n_train_per_intent), ("test", test_t, n_test_per_intent)):
            for k in range(n):
                splits[split][0].append(_fill(pool[k % len(pool)], rng, held_out=split == "test"))
                splits[split][1].append(label)
    for texts, labels in splits.values():                     # shuffle each split, pairs together
        order = list(range(len(texts)))
        rng.shuffle(order)
        texts[:], labels[:] = [texts[i] for i in order], [labels[i] for i in order]
    return {"train": splits["train"], "test": splits["test"], "intents": list(INTENTS)}
