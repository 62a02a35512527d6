"""The project's metrics as plain formulas, separate from any model.

- perplexity = exp(mean negative log-likelihood per token, in nats): the number of equally
  likely tokens the model is, on average, choosing between. The *mean*, never the sum: a sum
  grows with the length of the text and its exp overflows for any real file.
- bits per byte = total nats / (ln 2 * bytes of text): independent of the tokenizer, so models
  with different vocabularies (and a byte-level one) compare fairly.
- next-line exact match: the model's first generated line equals the file's next line. Python's
  indentation is syntax, so leading whitespace counts; trailing whitespace (and a "\r") is
  invisible in an editor and does not.
- parse rate: the share of programs `ast.parse` accepts; a completion that is fluent but
  unbalanced (an open bracket, a dedent in the wrong place) does not count.
"""
from __future__ import annotations

import ast
import math
import warnings
from typing import Sequence

import torch

__all__ = ["perplexity", "bits_per_byte", "first_line", "next_line_exact_match", "parses", "parse_rate"]


def perplexity(token_losses: torch.Tensor) -> float:
    """exp of the mean of per-token losses (nats). ValueError for an empty tensor."""
    if token_losses.numel() == 0:
        raise ValueError("perplexity of no tokens is undefined")
    return math.exp(float(token_losses.double().mean()))


def bits_per_byte(total_nats: float, n_bytes: int) -> float:
    """Total negative log-likelihood of a text (nats) in bits, per UTF-8 byte of that text."""
    if n_bytes <= 0:
        raise ValueError(f"n_bytes must be > 0, got {n_bytes}")
    return float(total_nats) / (math.log(2) * n_bytes)


def first_line(text: str) -> str:
    """Up to the first newline, trailing whitespace removed (leading kept: it is indentation)."""
    return text.split("\n", 1)[0].rstrip()


def next_line_exact_match(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Share of predictions whose first line equals the reference line (both via first_line)."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not predictions:
        raise ValueError("no predictions")
    return sum(first_line(p) == first_line(r) for p, r in zip(predictions, references)) / len(predictions)


def parses(program: str) -> bool:
    """True when ast.parse accepts the program (SyntaxError, null bytes, or a too-deep tree: False)."""
    try:
        with warnings.catch_warnings():  # invalid escape sequences warn; a warning is not an error
            warnings.simplefilter("ignore")
            ast.parse(program)
        return True
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False


def parse_rate(programs: Sequence[str]) -> float:
    """Share of programs that parse. ValueError for an empty list."""
    if not programs:
        raise ValueError("no programs")
    return sum(parses(p) for p in programs) / len(programs)
