"""The p01 lab's outcome check: a short pretraining run whose training chunks go through the
student's FIM transform, and what a test needs to judge it.

The grader runs it on its own side: the only call into the student's process is `fim(docs,
rate, seed)` (strings in, strings out), so the training, the losses and the baselines are the
course's, and the import of torch's compiler stack that the first optimizer triggers is paid
once per grading process instead of once per submission. Returns plain data (losses, counts,
weights). A runner (it calls the function it is given): no library module imports it.
"""
from __future__ import annotations

from dataclasses import asdict

from camplib.codegen.baselines import NgramModel
from camplib.codegen.evaluate import token_losses
from camplib.codegen.pretrain import PretrainConfig, build_model, prepare_data, pretrain

__all__ = ["outcome_run"]


def outcome_run(fim, config: dict, ngram_orders=(1, 2)) -> dict:
    """Train with `fim(docs, rate, seed)` on the training chunks; per-token held-out losses of
    the untrained and the trained model and of n-gram baselines, the FIM share of the training
    chunks, and the trained model's config and weights."""
    cfg = PretrainConfig(**config)
    data = prepare_data(cfg, fim)
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
