"""Scoring a chat model on held-out conversations, turn by turn.

For every assistant turn of a conversation the model gets the conversation so far (the user's
turns and the *reference* earlier answers, so one mistake does not spoil the later turns) and
writes its answer greedily until it emits the end-of-turn token (camplib.generate with
eos_id = <|im_end|>). Its first line is read as a dialogue state (`camplib.dialogue.data.
parse_state`) and compared with the reference:

- exact match: every slot (intent, order, product, address) right;
- slot accuracy: the fraction of the four slots right, and each slot's own accuracy ("per_slot");
  the intent slot's is the **intent accuracy** (per user turn: each answer follows one);
- stopped: the answer ended with <|im_end|> within the token budget (a model that never learned
  the end-of-turn token rambles on to the limit).

Each is reported over all turns and per turn number: turn 3's order slot was given turns ago,
so its accuracy shows whether the state is carried. "breaks_at" counts, per conversation, the
first turn whose state is wrong ("never" when every turn is right): where state tracking breaks.
"""
from __future__ import annotations

from collections import defaultdict

import torch

from camplib.dialogue.data import SLOTS, parse_state
from camplib.dialogue.template import render
from camplib.generate import generate

__all__ = ["assistant_turns", "generate_replies", "score_turn", "score", "evaluate"]


def assistant_turns(conversations) -> list[dict]:
    """One item per assistant turn: {"history": messages before it, "reference": its content,
    "turn": 1, 2, ..., "conversation": its index}."""
    out = []
    for c, conv in enumerate(conversations):
        k = 0
        for i, m in enumerate(conv):
            if m["role"] == "assistant":
                k += 1
                out.append({"history": conv[:i], "reference": m["content"], "turn": k, "conversation": c})
    return out


@torch.no_grad()
def generate_replies(model, tokenizer, histories, max_new_tokens: int = 48, batch_size: int = 64) -> list[dict]:
    """Greedy answers to each history (a list of messages ending with a user turn):
    [{"text": answer without <|im_end|>, "stopped": bool}], batched with left padding."""
    model.eval()
    device = next(model.parameters()).device
    prompts = [tokenizer.encode(render(h, add_generation_prompt=True)[0]) for h in histories]
    limit = model.config.max_seq_len
    out = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))   # similar lengths together
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        T = max(len(prompts[i]) for i in rows)
        if T >= limit:
            raise ValueError(f"a prompt of {T} tokens leaves no room to answer (max_seq_len={limit})")
        idx = torch.full((len(rows), T), tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), T), dtype=torch.long)
        for r, i in enumerate(rows):
            idx[r, T - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[r, T - len(prompts[i]):] = 1
        new = min(max_new_tokens, limit - T)
        result = generate(model, idx.to(device), new, eos_id=tokenizer.eot_id, attention_mask=mask.to(device))
        for r, i in enumerate(rows):
            ids = result[r, T:].tolist()
            stopped = tokenizer.eot_id in ids
            ids = ids[:ids.index(tokenizer.eot_id)] if stopped else ids
            out[i] = {"text": tokenizer.decode(ids), "stopped": stopped}
    return out


def score_turn(prediction: str, reference: str) -> dict:
    """{"exact": 0/1, "slots": fraction of SLOTS right, "right": {slot: 0/1}} for one answer."""
    got, want = parse_state(prediction), parse_state(reference)
    right = {s: float(got.get(s) == want.get(s)) for s in SLOTS}
    n = sum(right.values())
    return {"exact": float(n == len(SLOTS)), "slots": n / len(SLOTS), "right": right}


def score(predictions: list[dict], turns: list[dict]) -> dict:
    """Means of exact match, slot accuracy, intent accuracy and stopping, overall and per turn
    number; each slot's accuracy ("per_slot"); "breaks_at": {first wrong turn or "never":
    conversations} (turns without a "conversation" index count as conversations of their own)."""
    if len(predictions) != len(turns) or not turns:
        raise ValueError(f"{len(predictions)} predictions for {len(turns)} turns")
    by_turn, first_wrong = defaultdict(list), {}
    for i, (p, t) in enumerate(zip(predictions, turns)):
        s = score_turn(p["text"], t["reference"])
        by_turn[t["turn"]].append((s["exact"], s["slots"], float(p["stopped"]), s["right"]))
        conv = t.get("conversation", ("turn", i))
        first_wrong.setdefault(conv, "never")
        if not s["exact"] and first_wrong[conv] == "never":
            first_wrong[conv] = t["turn"]
    mean = lambda rows, k: sum(r[k] for r in rows) / len(rows)  # noqa: E731
    slot_mean = lambda rows, slot: sum(r[3][slot] for r in rows) / len(rows)  # noqa: E731
    every = [r for rows in by_turn.values() for r in rows]
    breaks = defaultdict(int)
    for turn in first_wrong.values():
        breaks[turn] += 1
    return {"exact_match": mean(every, 0), "slot_accuracy": mean(every, 1), "stopped": mean(every, 2),
            "intent_accuracy": slot_mean(every, "intent"),
            "per_slot": {slot: slot_mean(every, slot) for slot in SLOTS},
            "per_turn": {k: {"exact_match": mean(v, 0), "slot_accuracy": mean(v, 1),
                             "intent_accuracy": slot_mean(v, "intent"), "n": len(v)}
                         for k, v in sorted(by_turn.items())},
            "breaks_at": dict(sorted(breaks.items(), key=lambda kv: (kv[0] == "never", kv[0] if kv[0] != "never" else 0)))}


def evaluate(model, tokenizer, conversations, max_new_tokens: int = 48) -> dict:
    """score() of the model's answers on every assistant turn of `conversations`, plus the
    answers themselves under "predictions"."""
    turns = assistant_turns(conversations)
    predictions = generate_replies(model, tokenizer, [t["history"] for t in turns], max_new_tokens)
    return {**score(predictions, turns), "predictions": predictions}
