"""Fill-in-the-middle (Bavarian et al. 2022, "Efficient Training of Language Models to Fill in the Middle").

A left-to-right model only ever sees what comes before the cursor; in an editor the code after
it (the rest of the function, the closing bracket) matters as much. FIM teaches the same model
to use both without changing the architecture: cut a document at two random character
positions into prefix, middle and suffix, and move the middle to the end behind sentinels,

    PSM order:  <|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|> middle

so ordinary next-token training learns to produce the middle given both sides. At inference the
prompt is `<|fim_prefix|> before <|fim_suffix|> after <|fim_middle|>` and the model writes what
goes in between. Only a fraction of documents (`rate`, 0.5 in the paper) is transformed, so the
model stays a normal left-to-right model too ("FIM for free"). Cuts are at characters, before
tokenization (as StarCoder does), so the middle can start or end inside a token's text.
"""
from __future__ import annotations

import random
from typing import Sequence

from camplib.codegen.sentinels import FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, FIM_TOKENS

__all__ = ["FIM_PREFIX", "FIM_SUFFIX", "FIM_MIDDLE", "FIM_TOKENS", "fim_split", "apply_fim", "fim_parts",
           "fim_prompt"]



def fim_split(text: str, start: int, end: int) -> str:
    """text[:start] is the prefix, text[start:end] the middle, text[end:] the suffix, in PSM order.

    Raises ValueError unless 0 <= start <= end <= len(text)."""
    if not 0 <= start <= end <= len(text):
        raise ValueError(f"need 0 <= start <= end <= len(text) = {len(text)}, got start={start}, end={end}")
    prefix, middle, suffix = text[:start], text[start:end], text[end:]
    return f"{FIM_PREFIX}{prefix}{FIM_SUFFIX}{suffix}{FIM_MIDDLE}{middle}"


def apply_fim(docs: Sequence[str], rate: float, seed: int) -> list[str]:
    """Each document, transformed by fim_split with probability `rate` (two cut points drawn
    uniformly in [0, len], sorted), else unchanged. random.Random(seed): the same docs and seed
    give the same output on every machine."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    rng = random.Random(seed)
    out = []
    for doc in docs:
        if rng.random() < rate:
            start, end = sorted(rng.randint(0, len(doc)) for _ in range(2))
            out.append(fim_split(doc, start, end))
        else:
            out.append(doc)
    return out


def fim_parts(example: str) -> tuple[str, str, str]:
    """(prefix, middle, suffix) of a PSM example; ValueError if it is not exactly one well-formed
    example (each sentinel once, at the start / in order, none inside the parts)."""
    if not example.startswith(FIM_PREFIX) or any(example.count(t) != 1 for t in FIM_TOKENS):
        raise ValueError("a FIM example starts with <|fim_prefix|> and holds each sentinel exactly once")
    body = example[len(FIM_PREFIX):]
    prefix, sep, rest = body.partition(FIM_SUFFIX)
    suffix, sep2, middle = rest.partition(FIM_MIDDLE)
    if not (sep and sep2):
        raise ValueError("sentinels out of order: expected <|fim_prefix|> ... <|fim_suffix|> ... <|fim_middle|>")
    return prefix, middle, suffix


def fim_prompt(before: str, after: str) -> str:
    """What the model continues at inference: it writes the middle, then (trained so) an end of text."""
    return f"{FIM_PREFIX}{before}{FIM_SUFFIX}{after}{FIM_MIDDLE}"
