"""From a dynamic (eager) graph to a static one: torch.compile and torch.export on camplib's GPT.

Eager PyTorch runs Python for every op, every step. torch.compile traces the forward with
TorchDynamo into FX graphs and hands them to a backend (inductor fuses and generates kernels);
Python code it cannot trace (a data-dependent `if tensor.item()`) splits the graph there: a
*graph break*, with eager Python in between. `torch._dynamo.explain` lists them. torch.export
traces the whole forward into one graph with no Python left (breaks are errors), which can be
saved (`torch.export.save`, a .pt2 archive) and run in another process without the model's code.

Known on torch 2.13: an export example whose dimension is 1 specialises it to 1 (the 0/1 rule),
so a dynamic sequence length needs a `Dim` with min=2 and an example at least that long; and the
first torch.compile of even a small model takes ~16 s on 2 CPU cores (measure, keep it out of
CI's hot path).
"""
from __future__ import annotations

import logging
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "LogitsOnly",
    "export_logits",
    "graph_breaks",
    "loss_without_breaks",
    "run_saved_in_fresh_process",
    "save_program",
    "time_steps",
]


class LogitsOnly(nn.Module):
    """model(idx) -> logits only: GPT.forward returns (logits, loss), and an exported program
    (like any deployed artefact) should have one plain tensor output."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)[0]


@contextmanager
def _quiet_dynamo():
    """Dynamo logs every graph break as a warning to stderr; here they are returned instead."""
    logger = logging.getLogger("torch._dynamo")
    old = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(old)


def graph_breaks(fn, *args, **kwargs) -> dict:
    """{"graphs": n, "breaks": n, "reasons": [first line of each]} of fn(*args) under Dynamo."""
    torch._dynamo.reset()
    with _quiet_dynamo():
        explained = torch._dynamo.explain(fn)(*args, **kwargs)
    torch._dynamo.reset()
    reasons = [str(b.reason).strip().splitlines()[0] for b in explained.break_reasons]
    return {"graphs": explained.graph_count, "breaks": explained.graph_break_count, "reasons": reasons}


def loss_without_breaks(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The GPT's training loss with no graph break: camplib.losses.cross_entropy checks its targets
    with `if bool(bad.any())` (a host sync Dynamo cannot trace: 2 breaks, forward and backward of
    the check); torch's fused cross-entropy checks them inside its kernel. Same value."""
    logits, _ = model(idx)
    return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten(), ignore_index=-100)


def export_logits(model: nn.Module, example: torch.Tensor, max_len: int | None = None,
                  dynamic_batch: bool = True) -> torch.export.ExportedProgram:
    """torch.export of model(idx) -> logits, with the sequence length (and batch) dynamic.

    The example must have at least 2 tokens (and rows, for a dynamic batch): a size-1 example
    specialises that dimension to 1 (0/1 rule), so the program would only accept length 1."""
    if example.dim() != 2 or example.shape[1] < 2 or (dynamic_batch and example.shape[0] < 2):
        raise ValueError(f"export example must be (batch, seq) with seq >= 2{' and batch >= 2' if dynamic_batch else ''} "
                         f"(a size-1 dimension is specialised to 1), got {tuple(example.shape)}")
    max_len = max_len or model.config.max_seq_len
    dims = {1: torch.export.Dim("seq", min=2, max=max_len)}
    if dynamic_batch:
        dims[0] = torch.export.Dim("batch", min=2, max=1024)
    with _quiet_dynamo():
        return torch.export.export(LogitsOnly(model).eval(), (example,), dynamic_shapes={"idx": dims})


def save_program(program: torch.export.ExportedProgram, path: str | Path) -> Path:
    path = Path(path)
    torch.export.save(program, str(path))
    return path


_FRESH = """
import sys, torch
program = torch.export.load(sys.argv[1])
idx = torch.load(sys.argv[2], weights_only=True)
torch.save(program.module()(idx), sys.argv[3])
"""


def run_saved_in_fresh_process(path: str | Path, idx: torch.Tensor, timeout: float = 120.0) -> torch.Tensor:
    """Load the saved program in a new Python process (no camplib model code is used there) and
    return its logits for idx: proof the artefact stands alone."""
    path = Path(path)
    idx_file, out_file = path.with_suffix(".idx.pt"), path.with_suffix(".out.pt")
    torch.save(idx, idx_file)
    done = subprocess.run([sys.executable, "-c", _FRESH, str(path), str(idx_file), str(out_file)],
                          capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"loading {path} in a fresh process failed:\n{done.stderr[-2000:]}")
    return torch.load(out_file, weights_only=True)


def time_steps(step, n: int = 5, device: str | torch.device = "cpu") -> dict[str, float]:
    """{"first": seconds of the first call (compilation, for a compiled step), "median": of the
    next n}. `step()` runs one step; CUDA is synchronised around each."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    step()
    sync()
    first = time.perf_counter() - t0
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return {"first": first, "median": sorted(times)[len(times) // 2]}
