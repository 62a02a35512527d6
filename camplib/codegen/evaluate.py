"""The raw material of p01's metrics, measured on a model: per-token held-out losses, greedy
next lines, sampled function bodies. The formulas that turn them into numbers (perplexity, exact
match, parse rate) are camplib.codegen.metrics, or the student's own in the lab.

Next-line tasks: a held-out chunk cut after a line; the prompt is everything up to that line
break and the answer the next non-blank line. Function tasks: a held-out `def ...:` line (with
the code before it as context); the model samples a body, which is cut where the indentation
returns to the def's level (the function is over), and `def` + body is the program to parse.
"""
from __future__ import annotations

import random
import re
import textwrap
from typing import Sequence

import torch
import torch.nn.functional as F

from camplib.codegen.corpus import EOT
from camplib.generate import generate
from camplib.tokenizer import ByteBPE

__all__ = ["token_losses", "next_line_tasks", "predict_next_lines", "function_tasks", "sample_functions",
           "continue_text"]


@torch.no_grad()
def token_losses(model, blocks: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """Negative log-likelihood (nats) of every target token of every block, float64, flattened."""
    model.eval()
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(blocks), batch_size):
        block = blocks[start:start + batch_size].to(device)
        logits, _ = model(block[:, :-1])
        out.append(F.cross_entropy(logits.double().flatten(0, 1), block[:, 1:].flatten(), reduction="none").cpu())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def next_line_tasks(docs: Sequence[str], n: int, seed: int = 0, min_context_lines: int = 2) -> list[tuple[str, str]]:
    """Up to n (prompt, next line) pairs from docs, chosen with random.Random(seed)."""
    candidates = []
    for d, doc in enumerate(docs):
        lines = doc.split("\n")
        for i in range(min_context_lines, len(lines) - 1):
            if lines[i].strip():
                candidates.append((d, i))
    rng = random.Random(seed)
    picked = rng.sample(candidates, min(n, len(candidates)))
    return [("\n".join(docs[d].split("\n")[:i]) + "\n", docs[d].split("\n")[i]) for d, i in picked]


@torch.no_grad()
def continue_text(model, bpe: ByteBPE, prompt: str, max_new_tokens: int, temperature: float = 0.0,
                  top_p: float | None = None, generator: torch.Generator | None = None) -> str:
    """The model's continuation of prompt (special tokens allowed in it), cut at the first special
    token it writes (an end of text, or a stray sentinel).
    Only the last max_seq_len - max_new_tokens prompt tokens are kept (the context window)."""
    room = model.config.max_seq_len - max_new_tokens
    if room < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room in max_seq_len={model.config.max_seq_len}")
    eot = bpe.special_tokens[EOT]
    ids = bpe.encode(prompt, allow_special=True)[-room:] or [eot]
    device = next(model.parameters()).device
    out = generate(model.eval(), torch.tensor([ids], device=device), max_new_tokens, temperature=temperature,
                   top_p=top_p, eos_id=eot, generator=generator)[0, len(ids):].tolist()
    special = set(bpe.special_tokens.values())   # a sentinel in the output: the model has lost track
    cut = next((i for i, t in enumerate(out) if t in special), len(out))
    return bpe.decode(out[:cut])


def predict_next_lines(model, bpe: ByteBPE, prompts: Sequence[str], max_new_tokens: int = 24) -> list[str]:
    """Greedy continuation of each prompt (the raw text: the metric decides what counts)."""
    return [continue_text(model, bpe, p, max_new_tokens) for p in prompts]


_DEF = re.compile(r"^([ \t]*)(async\s+)?def\s+\w+\s*\(.*\)\s*(->.*)?:\s*$")


def function_tasks(docs: Sequence[str], n: int, seed: int = 0) -> list[tuple[str, str]]:
    """Up to n (context ending with a one-line `def ...:` header, that header line)."""
    found = []
    for doc in docs:
        lines = doc.split("\n")
        for i, line in enumerate(lines):
            if _DEF.match(line):
                found.append(("\n".join(lines[:i + 1]) + "\n", line))
    return random.Random(seed).sample(found, min(n, len(found)))


def _function_program(header: str, completion: str) -> str:
    """`def` line + the completion's lines up to the first non-blank one indented no deeper than
    the def (the function has ended there), dedented so it stands alone."""
    indent = len(header) - len(header.lstrip())
    body = []
    for line in completion.split("\n"):
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        body.append(line)
    return textwrap.dedent("\n".join([header, *body]).rstrip() + "\n")


def sample_functions(model, bpe: ByteBPE, tasks: Sequence[tuple[str, str]], max_new_tokens: int = 48,
                     temperature: float = 0.8, top_p: float = 0.95, seed: int = 0) -> list[str]:
    """For each (context, header): sample a body and return the standalone program to parse."""
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    return [_function_program(header, continue_text(model, bpe, context, max_new_tokens, temperature, top_p, g))
            for context, header in tasks]
