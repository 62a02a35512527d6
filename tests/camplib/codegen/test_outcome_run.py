"""p01's outcome run is remembered per grading process by a digest of the tokens it trains and
judges on: the same FIM output is judged on the same training (equal to training again), other
output trains anew, and the student's transform is called every time."""
import random

import torch

from camplib.codegen import outcome_run as runner
from camplib.codegen.fim import apply_fim

TINY = dict(n_train_files=1, n_val_files=1, vocab_size=260, block_size=16, d_model=16, n_layer=1, n_head=2,
            n_kv_head=1, steps=3, batch_size=4, lr=1e-2, warmup=1, eval_every=3)


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def test_the_same_tokens_train_once_and_give_what_training_again_gives(monkeypatch):
    monkeypatch.setattr(runner, "_RUNS", {})
    trained, calls = [], []
    real = runner.pretrain
    monkeypatch.setattr(runner, "pretrain", lambda *a, **k: trained.append(1) or real(*a, **k))

    def fim(docs, rate, seed):
        calls.append(len(docs))
        return apply_fim(docs, rate, seed)

    def reversed_docs(docs, rate, seed):   # other tokens: the training must run again
        return [d[::-1] for d in apply_fim(docs, rate, random.Random(seed).randrange(10**6))]

    first = runner.outcome_run(fim, TINY)
    first["weights"]["tok_emb.weight"].zero_()            # a caller's change never reaches the memory
    again = runner.outcome_run(fim, TINY)
    assert len(calls) == 2 and len(trained) == 1, (calls, trained)
    monkeypatch.setattr(runner, "_RUNS", {})
    fresh = runner.outcome_run(fim, TINY)
    assert len(trained) == 2 and _equal(again, fresh), "the remembered run differs from training again"
    other = runner.outcome_run(reversed_docs, TINY)
    assert len(trained) == 3 and not torch.equal(other["trained"], fresh["trained"])
