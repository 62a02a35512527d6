"""A small training loop that can be killed at any moment and resumed bit for bit.

Resuming exactly needs more than the weights: the optimizer's moments, the scheduler's step,
every random generator (dropout) and the position in the data (epoch, batch within it). The
Trainer checkpoints all of it atomically (camplib.train_state) every `ckpt_every` steps; on CPU
in fp32 a resumed run then produces the same per-step losses as one never interrupted.

The data comes from `loader_for_epoch(epoch) -> iterable of (x, y)`, which must give the same
batches in the same order each time it is called with the same epoch (shuffle with a
torch.Generator seeded from the epoch, not the global RNG): on resume the Trainer rebuilds the
current epoch's loader and skips the batches already used.

Each step's loss, learning rate, gradient norm, tokens/s and memory go to the `monitors`
(camplib.monitoring: TensorBoard event files, Prometheus metrics); measuring them draws no
random numbers and changes no tensor, so a monitored run is bit for bit the unmonitored one.
"""
from __future__ import annotations

import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch
from torch import nn

from camplib.train_state import (
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from camplib.monitoring import StepMetrics, process_memory_bytes
from camplib.optim import clip_grad_norm_

__all__ = ["Trainer", "accumulate_gradients"]

Batch = tuple[torch.Tensor, torch.Tensor]


def _global_grad_norm(params) -> float:
    """L2 norm of all gradients as one vector (what clipping would measure), without changing them."""
    norms = [p.grad.detach().float().norm() for p in params if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


def accumulate_gradients(model: nn.Module, micro_batches: Sequence[Batch], *,
                         autocast_dtype: torch.dtype | None = None, ignore_index: int = -100) -> float:
    """Forward and backward each (x, y) micro-batch, adding up gradients so they equal those
    of one batch holding all of them; returns that big batch's mean loss.

    The model's loss is a mean over the *valid* targets of its batch (y != ignore_index). The
    usual `loss / k` is right only when every micro-batch has as many valid targets; otherwise
    tokens of a sparse micro-batch count for more. So each micro-batch's mean is weighted by
    its share of all valid targets, n_i / N, which turns the sum back into one mean over N.
    """
    counts = [int((y != ignore_index).sum()) for _, y in micro_batches]
    total = sum(counts)
    if total == 0:
        raise ValueError("no valid targets in any micro-batch (all are ignore_index)")
    mean_loss = 0.0
    for (x, y), n in zip(micro_batches, counts):
        if n == 0:  # its mean would be 0/0 = nan; it contributes nothing anyway
            continue
        amp = torch.autocast(x.device.type, dtype=autocast_dtype) if autocast_dtype else nullcontext()
        with amp:
            _, loss = model(x, y)
        (loss * (n / total)).backward()
        mean_loss += loss.item() * n / total
    return mean_loss


class Trainer:
    """Runs optimizer steps of `grad_accum` micro-batches each, with gradient clipping, an lr
    scheduler, a progress bar, a loss history and atomic checkpoints.

    `model(x, y)` must return (logits, mean loss), as camplib.model.GPT does. `scheduler` may
    be None. `autocast_dtype=torch.bfloat16` runs forward passes under torch.autocast (bf16
    needs no loss scaling; fp16 would, and is refused). The progress bar writes to stdout
    (`progress_file`), because a graded notebook must keep stderr clean; progress=False hides it.
    `monitors` (e.g. camplib.monitoring's TensorBoardLogger, PrometheusExporter) receive a
    `StepMetrics` after every step; `self.last_metrics` holds the latest. `close()` closes them.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler,
                 loader_for_epoch: Callable[[int], Iterable[Batch]], *, grad_accum: int = 1,
                 clip: float | None = 1.0, ckpt_dir: str | Path | None = None, ckpt_every: int = 0,
                 device: str | torch.device = "cpu", autocast_dtype: torch.dtype | None = None,
                 log_every: int = 10, progress: bool = True, progress_file=None, monitors=()):
        if grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {grad_accum}")
        if autocast_dtype == torch.float16:
            raise ValueError("fp16 autocast needs loss scaling (GradScaler), which Trainer does not do; use bf16")
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.loader_for_epoch = loader_for_epoch
        self.grad_accum, self.clip, self.device = grad_accum, clip, torch.device(device)
        self.ckpt_dir = Path(ckpt_dir) if ckpt_dir is not None else None
        self.ckpt_every, self.log_every = ckpt_every, max(1, log_every)
        self.autocast_dtype = autocast_dtype
        self.progress, self.progress_file = progress, progress_file
        self.step = self.epoch = self.batch_index = 0  # optimizer steps done; data position
        self.losses: list[float] = []
        self.lrs: list[float] = []
        self.grad_norms: list[float] = []
        self._batches = None  # iterator over the current epoch, built lazily
        self.monitors = list(monitors)
        self.last_metrics: StepMetrics | None = None

    # ---- data position -------------------------------------------------------------------
    def _start_epoch(self, skip: int = 0) -> None:
        self._batches = iter(self.loader_for_epoch(self.epoch))
        self.batch_index = 0
        for _ in range(skip):
            if next(self._batches, None) is None:
                raise ValueError(f"loader_for_epoch({self.epoch}) has fewer than {skip} batches, "
                                 f"but the checkpoint says {skip} were used: is the loader deterministic?")
            self.batch_index += 1

    def _next_batch(self) -> Batch:
        if self._batches is None:
            self._start_epoch()
        batch = next(self._batches, None)
        if batch is None:  # epoch over: the next one starts
            if self.batch_index == 0:
                raise ValueError(f"loader_for_epoch({self.epoch}) yielded no batches")
            self.epoch += 1
            self._start_epoch()
            batch = next(self._batches, None)
            if batch is None:
                raise ValueError(f"loader_for_epoch({self.epoch}) yielded no batches")
        self.batch_index += 1
        x, y = batch
        return x.to(self.device), y.to(self.device)

    # ---- training ------------------------------------------------------------------------
    def train_step(self) -> float:
        """One optimizer step over grad_accum micro-batches; returns its mean loss."""
        if self.monitors and self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        micro_batches = [self._next_batch() for _ in range(self.grad_accum)]
        self.optimizer.zero_grad(set_to_none=True)
        loss = accumulate_gradients(self.model, micro_batches, autocast_dtype=self.autocast_dtype)
        if self.clip is not None:
            grad_norm = float(clip_grad_norm_(self.model.parameters(), self.clip))
            self.grad_norms.append(grad_norm)
        else:  # measured only for the monitors (it costs a device sync)
            grad_norm = _global_grad_norm(self.model.parameters()) if self.monitors else float("nan")
        self.lrs.append(self.optimizer.param_groups[0]["lr"])
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.step += 1
        self.losses.append(loss)
        if self.monitors:
            self._report(loss, grad_norm, sum(x.numel() for x, _ in micro_batches), start)
        return loss

    def _report(self, loss: float, grad_norm: float, tokens: int, start: float) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the step's kernels are done: time and memory are real
        seconds = time.perf_counter() - start
        self.last_metrics = StepMetrics(step=self.step, loss=loss, lr=self.lrs[-1], grad_norm=grad_norm,
                                        tokens=tokens, tokens_per_s=tokens / seconds if seconds > 0 else float("nan"),
                                        memory_bytes=process_memory_bytes(self.device))
        for monitor in self.monitors:
            monitor.log(self.last_metrics)

    def close(self) -> None:
        """Flush and close the monitors (TensorBoard files, the Prometheus server)."""
        for monitor in self.monitors:
            close = getattr(monitor, "close", None)
            if close is not None:
                close()

    def fit(self, max_steps: int, callback: Callable[["Trainer"], None] | None = None) -> list[float]:
        """Train until `max_steps` optimizer steps are done in total (resumed ones included);
        returns the loss of every step so far. `callback(trainer)` runs after each step, once
        any checkpoint of that step is on disk."""
        from tqdm.auto import tqdm
        bar = tqdm(total=max_steps, initial=self.step, desc="train", disable=not self.progress,
                   file=self.progress_file or sys.stdout)
        self.model.train()
        try:
            while self.step < max_steps:
                loss = self.train_step()
                bar.update(1)
                if self.step % self.log_every == 0 or self.step == max_steps:
                    bar.set_postfix(loss=f"{loss:.4f}", lr=f"{self.lrs[-1]:.2e}")
                if self.ckpt_dir is not None and self.ckpt_every and self.step % self.ckpt_every == 0:
                    self.save_checkpoint()
                if callback is not None:
                    callback(self)
        finally:
            bar.close()
            for monitor in self.monitors:  # what was logged is on disk, even if a step raised
                if hasattr(monitor, "flush"):
                    monitor.flush()
        return list(self.losses)

    # ---- checkpoints ---------------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        if self.ckpt_dir is None:
            raise ValueError("Trainer has no ckpt_dir")
        return self.ckpt_dir / "last.pt"

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "rng": rng_state(),
                "data": {"step": self.step, "epoch": self.epoch, "batch_index": self.batch_index},
                "history": {"losses": self.losses, "lrs": self.lrs, "grad_norms": self.grad_norms}}

    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        return save_checkpoint(path or self.checkpoint_path, self.state_dict())

    def resume(self, path: str | Path | None = None) -> bool:
        """Restore everything from `path` (default: ckpt_dir/last.pt). Returns False when the
        default checkpoint does not exist yet (a fresh run); a damaged one raises CheckpointError."""
        if path is None and not self.checkpoint_path.exists():
            return False
        state = load_checkpoint(path or self.checkpoint_path)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        data, history = state["data"], state["history"]
        self.step, self.epoch = data["step"], data["epoch"]
        self.losses, self.lrs, self.grad_norms = (list(history[k]) for k in ("losses", "lrs", "grad_norms"))
        self._start_epoch(skip=data["batch_index"])
        set_rng_state(state["rng"])  # last: building the loader must not shift the model's draws
        return True

    # ---- plots ---------------------------------------------------------------------------
    def plot_losses(self, ax=None, label: str = "train loss"):
        """The loss of every step so far, on `ax` (a new figure when None); returns the axes."""
        if ax is None:
            import matplotlib.pyplot as plt
            _, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(range(1, len(self.losses) + 1), self.losses, label=label)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("loss")
        ax.legend()
        return ax
