"""Watching a training run: per-step metrics to TensorBoard and to Prometheus.

A loss curve alone hides most failures. Next to it, the learning rate shows the schedule doing
what was meant, the gradient norm shows spikes before the loss does (and how often clipping
bites), tokens per second shows a data-loading or communication stall, and memory shows a leak
or an activation blow-up before the out-of-memory error. `camplib.trainer.Trainer` measures
these once per optimizer step (`StepMetrics`) and hands them to its `monitors`:

- `TensorBoardLogger(log_dir)`: event files through `torch.utils.tensorboard.SummaryWriter`
  (the `tensorboard` package), under the tags in `TAGS`; `tensorboard --logdir DIR` shows them,
  `read_scalars(DIR)` reads them back (what the tests and lab b04's plots do);
- `PrometheusExporter(registry=..., port=...)`: gauges and counters a Prometheus server scrapes
  from http://127.0.0.1:PORT/metrics while the job runs, for alerts on a live run (loss NaN,
  throughput dropped). It binds to loopback unless told otherwise: a training node should not
  publish its metrics to the whole network by accident.
Any object with `log(metrics)` (and optionally `close()`) can be a monitor.
"""
from __future__ import annotations

import math
import os
import resource
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["StepMetrics", "TensorBoardLogger", "PrometheusExporter", "read_scalars", "process_memory_bytes",
           "TAGS"]

# StepMetrics field -> TensorBoard tag
TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
        "tokens_per_s": "train/tokens_per_s", "memory_bytes": "train/memory_bytes"}


@dataclass
class StepMetrics:
    """What one optimizer step measured. grad_norm is the global L2 norm *before* clipping;
    tokens_per_s counts input tokens of all micro-batches over the step's wall time;
    memory_bytes is the peak allocated by torch on a CUDA device during the step, else the
    process's resident memory."""
    step: int
    loss: float
    lr: float
    grad_norm: float
    tokens: int
    tokens_per_s: float
    memory_bytes: int


def process_memory_bytes(device: torch.device | str = "cpu") -> int:
    """Peak bytes torch allocated on a CUDA device (since the last reset), else the process's
    resident set size (Linux /proc; elsewhere the peak from getrusage)."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux


class TensorBoardLogger:
    """Writes each step's metrics as TensorBoard scalars (global_step = the optimizer step)."""

    def __init__(self, log_dir: str | Path, flush_secs: int = 10):
        from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package

        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=flush_secs)

    def log(self, m: StepMetrics) -> None:
        for field, tag in TAGS.items():
            value = float(getattr(m, field))
            if math.isfinite(value) or field == "loss":  # a NaN loss is worth seeing; others are skipped
                self.writer.add_scalar(tag, value, m.step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of every scalar in the event files under log_dir, in step order
    (all of them: TensorBoard's reader keeps a sample by default)."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={SCALARS: 0})
    acc.Reload()
    return {tag: sorted((e.step, e.value) for e in acc.Scalars(tag)) for tag in acc.Tags()[SCALARS]}


class PrometheusExporter:
    """Prometheus metrics of the run: gauges `<prefix>_loss`, `_learning_rate`, `_grad_norm`,
    `_tokens_per_second`, `_memory_bytes`, `_step`, and counters `_steps_total`, `_tokens_total`.

    They live in `registry` (a new `CollectorRegistry` when None, so two trainers in one process
    never clash in the global one). With `port`, an HTTP server on `addr` (loopback by default)
    serves them at /metrics; port=0 picks a free port (`self.port` says which). `close()` stops it.
    """

    def __init__(self, registry=None, port: int | None = None, addr: str = "127.0.0.1", prefix: str = "camplib_train"):
        from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

        self.registry = registry if registry is not None else CollectorRegistry()
        gauge = lambda name, doc: Gauge(f"{prefix}_{name}", doc, registry=self.registry)  # noqa: E731
        self.gauges = {"loss": gauge("loss", "training loss of the last optimizer step"),
                       "lr": gauge("learning_rate", "learning rate used by the last step"),
                       "grad_norm": gauge("grad_norm", "global gradient L2 norm before clipping"),
                       "tokens_per_s": gauge("tokens_per_second", "input tokens per second, last step"),
                       "memory_bytes": gauge("memory_bytes", "peak device / resident process memory"),
                       "step": gauge("step", "optimizer steps done")}
        self.steps = Counter(f"{prefix}_steps", "optimizer steps taken by this process", registry=self.registry)
        self.tokens = Counter(f"{prefix}_tokens", "input tokens processed by this process", registry=self.registry)
        self.server = self.port = None
        if port is not None:
            self.server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
            self.port = self.server.server_port

    def log(self, m: StepMetrics) -> None:
        for field, gauge in self.gauges.items():
            gauge.set(float(getattr(m, field)))
        self.steps.inc()
        self.tokens.inc(m.tokens)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def values(self) -> dict[str, float]:
        """{sample name: value} as a scrape would see them (without the HTTP round trip)."""
        return {s.name: s.value for metric in self.registry.collect() for s in metric.samples}
