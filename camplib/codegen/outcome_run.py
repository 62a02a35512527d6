"""The p01 lab's outcome check: a short pretraining run whose training chunks go through the
student's FIM transform, and what a test needs to judge it.

The grader runs it on its own side: the only call into the student's process is `fim(docs,
rate, seed)` (strings in, strings out), so the training, the losses and the baselines are the
course's, and the import of torch's compiler stack that the first optimizer triggers is paid
once per grading process instead of once per submission. Returns plain data (losses, counts,
weights). A runner (it calls the function it is given): no library module imports it.

Everything after the student's `fim` is deterministic, so it is remembered per process by a digest
of what it depends on (the settings, the training and held-out token blocks, the vocabulary): a
submission whose apply_fim gives the same tokens as an earlier one (an honest classmate's, or the
reference next to a mistake elsewhere in the lab) is judged on the same training without running it
again; `fim` itself is called for every submission, and different tokens train anew.
"""
from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import asdict

from camplib.codegen.baselines import NgramModel
from camplib.codegen.evaluate import token_losses
from camplib.codegen.pretrain import PretrainConfig, build_model, prepare_data, pretrain

__all__ = ["outcome_run"]

_RUNS: dict[str, dict] = {}   # digest of the inputs -> result, the last few only
_REMEMBERED = 4


def outcome_run(fim, config: dict, ngram_orders=(1, 2)) -> dict:
    """Train with `fim(docs, rate, seed)` on the training chunks; per-token held-out losses of
    the untrained and the trained model and of n-gram baselines, the FIM share of the training
    chunks, and the trained model's config and weights."""
    cfg = PretrainConfig(**config)
    data = prepare_data(cfg, fim)
    key = _digest(asdict(cfg), list(ngram_orders), data)
    if key not in _RUNS:
        while len(_RUNS) >= _REMEMBERED:
            _RUNS.pop(next(iter(_RUNS)))
        _RUNS[key] = _judged(cfg, data, ngram_orders)
    return copy.deepcopy(_RUNS[key])


def _digest(settings: dict, orders: list, data) -> str:
    h = hashlib.sha256(json.dumps([settings, orders, data.bpe.vocab_size, data.bpe.special_tokens,
                                   len(data.corpus.train)], sort_keys=True, default=str).encode())
    for blocks in (data.train_blocks, data.val_blocks):
        h.update(json.dumps([str(blocks.dtype), list(blocks.shape)]).encode())
        h.update(blocks.contiguous().numpy().tobytes())
    return h.hexdigest()


def _judged(cfg: PretrainConfig, data, ngram_orders) -> dict:
    untrained = build_model(cfg, data.bpe.vocab_size)
    model, trainer, history = pretrain(cfg, data)
    streams = [b.tolist() for b in data.train_blocks]
    ngram = {str(n): NgramModel(n, data.bpe.vocab_size).fit(streams) for n in ngram_orders}
    val = [b.tolist() for b in data.val_blocks]
    import torch
    return {"untrained": token_losses(untrained, data.val_blocks),
            "trained": token_losses(model, data.val_blocks),
            "ngram": {n: torch.cat([m.token_losses(v) for v in val]) for n, m in ngram.items()},
            "train_losses": trainer.losses, "config": asdict(model.config),
            "fim_share": sum(int(b.eq(data.bpe.special_tokens["<|fim_middle|>"]).sum()) for b in data.train_blocks)
                         / max(1, len(data.corpus.train)),
            "weights": {k: v.detach().cpu() for k, v in model.state_dict().items()}}
