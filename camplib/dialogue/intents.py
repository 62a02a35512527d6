"""The intent a dialogue model (p02) reads in each user turn, with a confidence.

The model answers a user turn with a state line that starts `intent: <name>;`. To score any text
against it, `intent_scores` asks the model how likely each intent name is right after
`<|im_start|>assistant\\nintent:` (the sum of the log-probabilities of the name's tokens and of
the `;` that closes it) and normalises over the known intents: the most likely one is the
prediction, its share the confidence. This is the model's own distribution restricted to the
closed set, so it needs no parsing of free text and gives an intent even when greedy decoding
would ramble.

    predict_intents(model, tokenizer, ["where is my order 482?"])        # [("track_order", 0.98)]
    intents_per_turn(model, tokenizer, ["where is my order?", "it's 482", "refund me instead"])

`intents_per_turn` plays a whole conversation: after each user turn the model's own greedy answer
(camplib.dialogue.evaluate.generate_replies) joins the history, as in a real chat.
"""
from __future__ import annotations

import torch

from camplib.dialogue.data import INTENTS
from camplib.dialogue.evaluate import generate_replies
from camplib.dialogue.template import render

__all__ = ["intent_scores", "predict_intents", "intents_per_turn"]


@torch.no_grad()
def intent_scores(model, tokenizer, histories: list[list[dict]], intents=INTENTS) -> torch.Tensor:
    """(N, len(intents)) probabilities of each intent for the next assistant turn of each history
    (a list of messages ending with a user turn)."""
    model.eval()
    device = next(model.parameters()).device
    # " name;" with its space: byte-level BPE splits words with their leading space, so prefix + name
    # tokenize as the whole answer does (tests/camplib/dialogue/test_intents.py checks it)
    prefix = [tokenizer.encode(render(h, add_generation_prompt=True)[0] + "intent:") for h in histories]
    names = [tokenizer.encode(f" {name};") for name in intents]
    rows = [(p, n) for p in prefix for n in names]
    T = max(len(p) + len(n) for p, n in rows)
    if T > model.config.max_seq_len:
        raise ValueError(f"a history of {T} tokens does not fit the model (max_seq_len={model.config.max_seq_len})")
    scores = []
    for start in range(0, len(rows), 64):
        chunk = rows[start:start + 64]
        idx = torch.full((len(chunk), T), tokenizer.pad_id, dtype=torch.long)   # right padding: never attended to
        for r, (p, n) in enumerate(chunk):
            idx[r, :len(p) + len(n)] = torch.tensor(p + n)
        logp = model(idx.to(device))[0].float().log_softmax(-1).cpu()
        for r, (p, n) in enumerate(chunk):
            positions = torch.arange(len(p) - 1, len(p) + len(n) - 1)         # logits at t predict token t + 1
            scores.append(logp[r, positions, torch.tensor(n)].sum())
    return torch.stack(scores).view(len(histories), len(intents)).softmax(-1)


def predict_intents(model, tokenizer, texts: list[str], intents=INTENTS) -> list[tuple[str, float]]:
    """[(intent, confidence)] for raw utterances, each the first user turn of a conversation."""
    if isinstance(texts, str):
        raise TypeError("predict_intents takes a list of utterances; wrap a single one in a list")
    if not texts:
        return []
    p = intent_scores(model, tokenizer, [[{"role": "user", "content": t}] for t in texts], intents)
    conf, idx = p.max(-1)
    return [(intents[int(i)], float(c)) for i, c in zip(idx, conf)]


def intents_per_turn(model, tokenizer, user_turns: list[str], intents=INTENTS,
                     max_new_tokens: int = 48) -> list[dict]:
    """One conversation, turn by turn: [{"intent", "confidence", "answer"}] per user turn, the
    model's own answers carried in the history."""
    history, out = [], []
    for text in user_turns:
        history.append({"role": "user", "content": text})
        p = intent_scores(model, tokenizer, [history], intents)[0]
        answer = generate_replies(model, tokenizer, [history], max_new_tokens)[0]["text"]
        history.append({"role": "assistant", "content": answer})
        out.append({"intent": intents[int(p.argmax())], "confidence": float(p.max()), "answer": answer})
    return out
