"""camplib.trainer (gradient accumulation, Trainer, exact resume) and camplib.train_state."""
import io
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from autograder.checks import check_close, check_equal
from camplib.train_state import (
    CheckpointError,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from camplib.model import GPT, GPTConfig
from camplib.optim import AdamW
from camplib.schedule import warmup_scheduler
from camplib.trainer import Trainer, accumulate_gradients

# fp64 gradients / parameters of k micro-batches vs one big batch: the same sums in another order
TOL64 = dict(atol=1e-12, rtol=1e-9)
REPO = Path(__file__).resolve().parents[2]
VOCAB, SEQ = 64, 12


def tiny_gpt(seed=0, dtype=torch.float32, dropout=0.0):
    torch.manual_seed(seed)
    cfg = GPTConfig.gpt2_style(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=4, max_seq_len=SEQ,
                               dropout=dropout)
    model = GPT(cfg).to(dtype)
    return Fp64Loss(model) if dtype == torch.float64 else model


class Fp64Loss(torch.nn.Module):
    """GPT's own loss is computed in fp32 (logits.float()), even for an fp64 model; for the
    tight fp64 comparisons we take its logits and the cross-entropy in fp64."""

    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, x, y):
        logits, _ = self.gpt(x)
        return logits, F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)


def token_batch(rows, seed=0):
    seq = torch.randint(0, VOCAB, (rows, SEQ + 1), generator=torch.Generator().manual_seed(seed))
    return seq[:, :-1], seq[:, 1:].clone()


def grads_of(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


# ---- gradient accumulation ---------------------------------------------------------------
def big_and_micro(valid_per_row):
    """8 rows split into 4 micro-batches of 2; row r keeps its first valid_per_row[r] targets."""
    x, y = token_batch(8)
    for r, n in enumerate(valid_per_row):
        y[r, n:] = -100
    micro = [(x[i:i + 2], y[i:i + 2]) for i in range(0, 8, 2)]
    return (x, y), micro


UNEQUAL = [12, 12, 12, 12, 1, 2, 12, 3]  # micro-batches with 24, 24, 3 and 15 valid targets


def test_accumulation_equals_big_batch_fp64():
    (x, y), micro = big_and_micro(UNEQUAL)
    big_model, acc_model = tiny_gpt(dtype=torch.float64), tiny_gpt(dtype=torch.float64)
    _, big_loss = big_model(x, y)
    big_loss.backward()
    acc_loss = accumulate_gradients(acc_model, micro)
    assert acc_loss == pytest.approx(big_loss.item(), rel=1e-12)
    big_grads, acc_grads = grads_of(big_model), grads_of(acc_model)
    for name in big_grads:
        check_close(f"grad {name}", acc_grads[name], big_grads[name], **TOL64)
    for model in (big_model, acc_model):
        AdamW(model.parameters(), lr=1e-2).step()
    for (name, a), b in zip(acc_model.named_parameters(), big_model.parameters()):
        check_close(f"param {name} after a step", a.detach(), b.detach(), **TOL64)


def naive_accumulate(model, micro):
    for x, y in micro:
        (model(x, y)[1] / len(micro)).backward()


# second case: rows differ, but every micro-batch has 17 valid targets
@pytest.mark.parametrize("valid, naive_ok", [(UNEQUAL, False), ([12, 5, 5, 12, 10, 7, 8, 9], True)])
def test_loss_over_k_is_right_only_for_equal_token_counts(valid, naive_ok):
    (x, y), micro = big_and_micro(valid)
    counts = [int((m[1] != -100).sum()) for m in micro]
    big_model, naive_model = tiny_gpt(dtype=torch.float64), tiny_gpt(dtype=torch.float64)
    big_model(x, y)[1].backward()
    naive_accumulate(naive_model, micro)
    worst = max(((naive_model.get_parameter(n).grad - g).abs().max() / g.abs().max()).item()
                for n, g in grads_of(big_model).items())
    assert (len(set(counts)) == 1) == naive_ok, counts
    if naive_ok:
        assert worst < 1e-10
    else:
        assert worst > 1e-2  # the pitfall: a micro-batch of 3 tokens weighs as much as one of 24


def test_accumulation_skips_fully_ignored_micro_batch():
    (x, y), micro = big_and_micro([12, 12, 0, 0, 5, 5, 12, 12])
    model = tiny_gpt(dtype=torch.float64)
    loss = accumulate_gradients(model, micro)
    assert np.isfinite(loss) and all(torch.isfinite(g).all() for g in grads_of(model).values())
    with pytest.raises(ValueError, match="no valid targets"):
        accumulate_gradients(model, [(x[:1], torch.full_like(y[:1], -100))])


# ---- checkpoint files -----------------------------------------------------------------------
def test_checkpoint_round_trip_with_rng_states(tmp_path):
    model = tiny_gpt()
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    state = {"model": model.state_dict(), "rng": rng_state(), "data": {"step": 6, "epoch": 1, "batch_index": 2}}
    expected = (random.random(), np.random.rand(3), torch.rand(3))
    path = save_checkpoint(tmp_path / "ckpt.pt", state)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temp file left behind
    loaded = load_checkpoint(path)  # weights_only=True: the RNG states are plain values and tensors
    assert loaded["data"] == {"step": 6, "epoch": 1, "batch_index": 2}
    for name, tensor in model.state_dict().items():
        check_equal(name, loaded["model"][name], tensor)
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    set_rng_state(loaded["rng"])
    assert random.random() == expected[0]
    assert np.array_equal(np.random.rand(3), expected[1])
    check_equal("torch draw", torch.rand(3), expected[2])


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "ckpt.pt", {"step": 1})
    real_save = torch.save

    def crash_midway(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt  # a kill while writing
    monkeypatch.setattr(torch, "save", crash_midway)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, {"step": 2})
    monkeypatch.setattr(torch, "save", real_save)
    assert load_checkpoint(path) == {"step": 1}  # the old checkpoint is intact
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_damaged_checkpoints_raise_clear_errors(tmp_path):
    good = save_checkpoint(tmp_path / "good.pt", {"model": tiny_gpt().state_dict()})
    data = good.read_bytes()
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(data[: len(data) // 2])
    noise = tmp_path / "noise.pt"
    noise.write_bytes(np.random.default_rng(0).bytes(4096))
    flipped = tmp_path / "flipped.pt"  # bits flipped inside tensor data: torch.load alone accepts it
    middle = data.index(tiny_gpt().state_dict()["tok_emb.weight"].numpy().tobytes()[:64])
    flipped.write_bytes(data[:middle] + bytes(64) + data[middle + 64:])
    other = tmp_path / "other.pt"
    torch.save([1, 2, 3], other)
    refused = save_checkpoint(tmp_path / "refused.pt", {"rng": np.random.get_state()})  # raw ndarray
    for path, what in [(truncated, "truncated or corrupt"), (noise, "truncated or corrupt"),
                       (flipped, "CRC"), (tmp_path / "missing.pt", "no such file"),
                       (other, "not a camplib checkpoint"), (refused, "weights_only loading refuses")]:
        with pytest.raises(CheckpointError, match=what) as info:
            load_checkpoint(path)
        assert str(path) in str(info.value)


# ---- Trainer --------------------------------------------------------------------------------
DATA_ROWS, ROWS_PER_BATCH = 10, 2  # 5 batches per epoch


def loader_for_epoch(epoch):
    """Deterministic per epoch: its own generator, seeded by the epoch."""
    x, y = token_batch(DATA_ROWS, seed=123)
    order = torch.randperm(DATA_ROWS, generator=torch.Generator().manual_seed(epoch))
    for i in range(0, DATA_ROWS, ROWS_PER_BATCH):
        yield x[order[i:i + ROWS_PER_BATCH]], y[order[i:i + ROWS_PER_BATCH]]


def make_trainer(ckpt_dir=None, seed=0, **kw):
    model = tiny_gpt(seed=seed, dropout=0.1)  # dropout: the RNG state must be restored too
    opt = AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    sched = warmup_scheduler(opt, "cosine", warmup=2, total=8)
    kw = dict(dict(grad_accum=2, ckpt_dir=ckpt_dir, ckpt_every=3, progress=False), **kw)
    return Trainer(model, opt, sched, loader_for_epoch, **kw)


def test_trainer_resume_in_process_is_exact(tmp_path):
    reference = make_trainer().fit(8)
    assert len(reference) == 8 and reference[-1] < reference[0]
    first = make_trainer(tmp_path)
    first.fit(4)  # checkpoint at step 3: epoch 1, batch 1 (5 batches per epoch, 2 per step)
    second = make_trainer(tmp_path, seed=7)  # other weights: all must come from the checkpoint
    assert second.resume()
    assert (second.step, second.epoch, second.batch_index) == (3, 1, 1)
    assert second.fit(8) == reference  # exact floats
    assert not make_trainer(tmp_path / "empty").resume()  # no checkpoint yet: a fresh start


def test_trainer_progress_goes_to_stdout_only(capsys):
    out = io.StringIO()
    make_trainer(progress=True, progress_file=out, log_every=1).fit(2)
    captured = capsys.readouterr()
    assert "train" in out.getvalue() and "loss=" in out.getvalue()
    assert captured.err == ""
    make_trainer(progress=True, log_every=1).fit(1)  # default: stdout
    captured = capsys.readouterr()
    assert "train" in captured.out and captured.err == ""


def test_trainer_bf16_autocast_on_cpu():
    fp32 = make_trainer().fit(4)
    trainer = make_trainer(autocast_dtype=torch.bfloat16)
    bf16 = trainer.fit(4)
    assert all(np.isfinite(bf16)) and bf16 != fp32  # autocast really changed the arithmetic
    assert max(abs(a - b) for a, b in zip(bf16, fp32)) < 0.05
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # master weights fp32
    with pytest.raises(ValueError, match="fp16"):
        make_trainer(autocast_dtype=torch.float16)


def test_plot_losses():
    import matplotlib
    matplotlib.use("Agg")
    trainer = make_trainer()
    trainer.fit(3)
    ax = trainer.plot_losses()
    (line,) = ax.get_lines()
    assert list(line.get_ydata()) == trainer.losses and list(line.get_xdata()) == [1, 2, 3]


# ---- a real SIGKILL ------------------------------------------------------------------------
SCRIPT = textwrap.dedent("""
    import json, sys, time
    import torch
    torch.set_num_threads(1)  # one thread: the same reduction order in every run
    from camplib.model import GPT, GPTConfig
    from camplib.optim import AdamW, decay_param_groups
    from camplib.schedule import warmup_scheduler
    from camplib.trainer import Trainer

    ckpt_dir, max_steps, pause_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.manual_seed(0)
    model = GPT(GPTConfig.gpt2_style(vocab_size=64, d_model=32, n_layer=2, n_head=4, max_seq_len=16,
                                     dropout=0.1))
    data = torch.randint(0, 64, (20, 17), generator=torch.Generator().manual_seed(1))

    def loader_for_epoch(epoch):  # 5 batches of 4 rows, shuffled per epoch
        order = torch.randperm(len(data), generator=torch.Generator().manual_seed(epoch))
        for i in range(0, len(data), 4):
            rows = data[order[i:i + 4]]
            yield rows[:, :-1], rows[:, 1:]

    opt = AdamW(decay_param_groups(model, 0.1), lr=3e-3)
    sched = warmup_scheduler(opt, "cosine", warmup=3, total=max_steps)
    trainer = Trainer(model, opt, sched, loader_for_epoch, grad_accum=2, ckpt_dir=ckpt_dir,
                      ckpt_every=3, progress=False)
    print(json.dumps({"resumed": trainer.resume(), "step": trainer.step}), flush=True)

    def report(t):
        print(json.dumps({"step": t.step, "loss": t.losses[-1]}), flush=True)
        if t.step == pause_at:  # the checkpoint of this step is on disk: wait to be killed
            time.sleep(120)
    print(json.dumps({"losses": trainer.fit(max_steps, callback=report)}), flush=True)
""")


def start(script, ckpt_dir, max_steps, pause_at=-1):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, str(script), str(ckpt_dir), str(max_steps), str(pause_at)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc):
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return [json.loads(line) for line in out.splitlines()]


@pytest.mark.slow
def test_sigkill_and_resume_reproduces_losses_exactly(tmp_path):
    script = tmp_path / "train_tiny.py"
    script.write_text(SCRIPT)
    uninterrupted = start(script, tmp_path / "ref", 12)  # both at once: the imports take seconds
    proc = start(script, tmp_path / "run", 12, pause_at=6)
    try:
        seen = [json.loads(proc.stdout.readline())]
        while seen[-1].get("step") != 6:
            line = proc.stdout.readline()
            assert line, f"the run ended early: {proc.stderr.read()}"
            seen.append(json.loads(line))
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:  # a failed assertion above: do not leave it sleeping
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    reference = finish(uninterrupted)[-1]["losses"]
    assert len(reference) == 12
    assert seen[0] == {"resumed": False, "step": 0}
    assert [s["loss"] for s in seen[1:]] == reference[:6]

    lines = finish(start(script, tmp_path / "run", 12))
    assert lines[0] == {"resumed": True, "step": 6}
    assert [line["step"] for line in lines[1:-1]] == list(range(7, 13))
    assert [line["loss"] for line in lines[1:-1]] == reference[6:]  # steps 7..12, exact floats
    assert lines[-1]["losses"] == reference
