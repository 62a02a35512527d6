"""Run camplib's GPT split with tensor (and sequence) parallelism on t ranks and bring back plain
data: what tests, benchmarks and lab a03's grader compare with the dense model. A runner: a rank
function plus one call of camplib.dist.on_ranks (the library in tensor/tensor_model never imports it).
"""
from __future__ import annotations

import torch

from camplib.dist import on_ranks
from camplib.parallel.tensor import unshard
from camplib.parallel.tensor_model import TensorParallelGPT

__all__ = ["split_gpt_rank", "run_split_gpt"]


def split_gpt_rank(rank: int, t: int, cases: list[dict], idx: torch.Tensor, targets: torch.Tensor) -> dict:
    """A rank function: for each case {"model": dense GPT, "sequence_parallel": bool} load this
    rank's shards of the dense model, run forward and backward on (idx, targets), and return
    {"cases": [...]} with the full logits, the loss, this rank's gradients and the shard layout.
    The dense models reach the ranks by fork, unpickled."""
    out = []
    for case in cases:
        model = TensorParallelGPT.from_dense(case["model"], sequence_parallel=case.get("sequence_parallel", False))
        logits, loss = model(idx, targets)
        loss.backward()
        model.sync_grads()
        out.append({"logits": model.full_logits(logits.detach()), "loss": loss.detach(),
                    "grads": {n: p.grad for n, p in model.named_parameters()}, "layout": model.shard_layout()})
    return {"cases": out}


def run_split_gpt(t: int, cases: list[dict], idx: torch.Tensor, targets: torch.Tensor, *,
                  backend: str = "gloo", timeout: float = 60.0) -> list[dict]:
    """Run `split_gpt_rank` on t ranks; per case: "logits" and "loss" of every rank (lists),
    "grads" joined back into the dense model's shapes, "replicated" (per rank: the gradients
    of the parameters every rank holds whole, which must all be equal) and "layout"."""
    ranks = on_ranks(split_gpt_rank, t, cases, idx, targets, backend=backend, timeout=timeout)["cases"]
    results = []
    for i in range(len(cases)):
        per_rank = [r[i] for r in ranks]
        layout = per_rank[0]["layout"]
        results.append({
            "logits": [r["logits"] for r in per_rank], "loss": [r["loss"] for r in per_rank],
            "grads": {n: unshard([r["grads"][n] for r in per_rank], s) for n, s in layout.items()},
            "replicated": [{n: r["grads"][n] for n, s in layout.items() if s.dim is None} for r in per_rank],
            "layout": layout,
        })
    return results
