"""Pretraining wires the course's pieces: it learns, resumes exactly from its checkpoint, and
saves a checkpoint the serving loader (camp serve, p03) reads with the same logits."""
import pytest
import torch

from camplib.codegen.corpus import chunk_lines, load_corpus
from camplib.codegen.evaluate import _function_program, continue_text, next_line_tasks, token_losses
from camplib.codegen.pretrain import (PretrainConfig, build_model, prepare_data, pretrain, pretrain_code_model,
                                     save_code_model)
from camplib.serving.loading import load_camplib
from tests.support import assert_close

TINY = dict(n_train_files=2, n_val_files=1, vocab_size=300, block_size=32, d_model=32, n_layer=1, n_head=2,
            n_kv_head=1, steps=12, batch_size=4, lr=1e-2, warmup=2, eval_every=6)


@pytest.fixture(scope="module")
def data():
    return prepare_data(PretrainConfig(**TINY))


def test_chunks_join_back_to_the_file():
    text = "a = 1\n\n" + "x" * 50 + "\nb = 2\n"
    chunks = chunk_lines(text, 20)
    assert all(len(c) <= 20 for c in chunks) and "".join(chunks) == text.replace("\n\n", "\n\n")
    corpus = load_corpus(2, 1)
    assert not set(corpus.train_files) & set(corpus.val_files)


def test_learns_reports_and_resumes_exactly(data, tmp_path):
    reported = []
    model, trainer, history = pretrain(PretrainConfig(**TINY), data, report=lambda s, v: reported.append((s, v)))
    assert [s for s, _ in history] == [6, 12] and reported == history
    untrained = token_losses(build_model(PretrainConfig(**TINY), data.bpe.vocab_size), data.val_blocks).mean()
    assert history[-1][1] < float(untrained) - 0.5, (history, float(untrained))
    pretrain(PretrainConfig(**{**TINY, "ckpt_dir": str(tmp_path), "ckpt_every": 3}), data, stop_after=6)
    _, resumed, _ = pretrain(PretrainConfig(**{**TINY, "ckpt_dir": str(tmp_path)}), data)
    assert_close("losses of a run resumed at step 6", torch.tensor(resumed.losses), torch.tensor(trainer.losses),
                 atol=1e-6, rtol=0)


def test_serving_checkpoint_round_trip(data, tmp_path):
    model = build_model(PretrainConfig(**TINY), data.bpe.vocab_size).eval()
    path = save_code_model(tmp_path / "code_model.pt", model, data.bpe)
    served = load_camplib(path)
    idx = data.val_blocks[:2, :-1]
    with torch.no_grad():
        assert_close("served logits", served.model(idx)[0], model(idx)[0], atol=0, rtol=0)
    assert served.encode("def f():") == data.bpe.encode("def f():") and served.stop_ids == (data.bpe.special_tokens["<|endoftext|>"],)
    out = continue_text(model, data.bpe, "def f(x):\n", 8)
    assert isinstance(out, str) and "<|endoftext|>" not in out


def test_task_builders():
    tasks = next_line_tasks(["a\nb\nc\n  d\n", "x\n"], n=5, seed=0)
    assert sorted(tasks) == [("a\nb\n", "c"), ("a\nb\nc\n", "  d")]
    program = _function_program("    def f(self):", "\n        return 1\n    def g(self):\n")
    assert program == "def f(self):\n\n    return 1\n"


def test_pretrain_code_model_in_one_call(tmp_path):
    model, bpe, path = pretrain_code_model(PretrainConfig(**{**TINY, "steps": 2}), tmp_path / "m.pt")
    served = load_camplib(path)
    assert served.model.config == model.config and served.encode("x = 1") == bpe.encode("x = 1")
