"""Where a training step's time goes, and how close it comes to the hardware's peak.

`profile_step` runs torch.profiler over one training step (forward, loss, backward, optimizer
step) of a model after warm-up steps, and returns the operators sorted by *self* time (time in
the operator itself, not in what it calls): the table that says what to fuse or remove first.

`op_cpu_times` measures the same table in CPU time of the calling thread, operator by operator
(a TorchDispatchMode around every aten call): on a machine shared with other jobs, wall-clock
self times are inflated wherever the scheduler preempted, CPU time is not. Eager code only: under
a dispatch mode torch.compile'd functions fall back to eager (use profile_step for them).

`flops_per_token` is the usual estimate for a decoder-only transformer trained with backward
(Kaplan et al. 2020; PaLM appendix B): 6 N for the N non-embedding parameters (2 multiply-adds
forward, 4 backward) plus 12 L d T for attention's scores and weighted sums (L layers, width d,
context T). `mfu` divides the achieved flops (tokens/s times that) by the peak the caller gives:
model flops utilisation, comparable across implementations because it ignores recomputation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["OpTime", "profile_step", "op_cpu_times", "format_table", "flops_per_token", "mfu"]


@dataclass
class OpTime:
    name: str
    self_ms: float          # time spent in the operator itself (CPU, or CUDA on a GPU), per step
    total_ms: float         # including the operators it called
    calls: int


def profile_step(step: Callable[[], object], warmup: int = 1, top: int = 10, device: str | torch.device = "cpu") -> list[OpTime]:
    """The `top` operators of one call of step() by self time, after `warmup` untimed calls.
    On CUDA the kernels' device time is used (the CPU only launches them)."""
    if warmup < 0 or top < 1:
        raise ValueError(f"profile_step: warmup must be >= 0 and top >= 1, got warmup={warmup}, top={top}")
    cuda = torch.device(device).type == "cuda"
    for _ in range(warmup):
        step()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as prof:
        step()
        if cuda:
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if e.device_type != torch.autograd.DeviceType.CPU:
            continue        # a CUDA kernel's own event: its time is already its launching operator's device time
        self_us = e.self_device_time_total if cuda else e.self_cpu_time_total
        total_us = e.device_time_total if cuda else e.cpu_time_total
        rows.append(OpTime(e.key, self_us / 1e3, total_us / 1e3, e.count))
    rows.sort(key=lambda r: r.self_ms, reverse=True)
    return rows[:top]


def op_cpu_times(step: Callable[[], object], warmup: int = 1) -> tuple[list[OpTime], float]:
    """(operators of one call of step() by CPU time of this thread, that call's CPU ms in all), after
    `warmup` untimed calls. Each aten operator's time is its whole call as the dispatcher sees it
    below autograd (what it runs inside, e.g. a composite's parts, is not listed again), so
    self_ms == total_ms. Backward's operators are included: on the CPU autograd runs them in
    the calling thread. The total includes the Python between operators and this mode's own
    overhead (~10 us per operator), so the listed times sum to less than it."""
    import time
    from collections import defaultdict

    from torch.utils._python_dispatch import TorchDispatchMode

    clock = time.thread_time_ns
    spent, calls = defaultdict(int), defaultdict(int)

    class _Timer(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            start = clock()
            out = func(*args, **(kwargs or {}))
            spent[func.name()] += clock() - start
            calls[func.name()] += 1
            return out

    if warmup < 0:
        raise ValueError(f"op_cpu_times: warmup must be >= 0, got {warmup}")
    for _ in range(warmup):
        step()
    start = clock()
    with _Timer():
        step()
    total = (clock() - start) / 1e6
    rows = [OpTime(name, ns / 1e6, ns / 1e6, calls[name]) for name, ns in spent.items()]
    rows.sort(key=lambda r: r.self_ms, reverse=True)
    return rows, total


def format_table(rows: list[OpTime]) -> str:
    """The rows as a fixed-width text table, with each operator's share of the listed self time."""
    total = sum(r.self_ms for r in rows) or 1.0
    lines = [f"{'operator':<40} {'self ms':>9} {'share':>6} {'total ms':>9} {'calls':>6}"]
    lines += [f"{r.name[:40]:<40} {r.self_ms:9.2f} {r.self_ms / total:6.1%} {r.total_ms:9.2f} {r.calls:6d}" for r in rows]
    return "\n".join(lines)


def flops_per_token(n_params: int, n_layer: int, d_model: int, seq_len: int) -> float:
    """6 N + 12 L d T: training flops per token (forward + backward), N non-embedding parameters."""
    for name, value in (("n_params", n_params), ("n_layer", n_layer), ("d_model", d_model), ("seq_len", seq_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"flops_per_token: {name} must be a non-negative int, got {value!r}")
    return 6.0 * n_params + 12.0 * n_layer * d_model * seq_len


def mfu(tokens_per_second: float, flops_token: float, peak_flops: float) -> float:
    """Model flops utilisation: achieved flops (tokens/s x flops per token) / peak flops per second
    of the hardware (e.g. 989e12 for an H100's dense bf16; give the number of your device)."""
    if peak_flops <= 0 or tokens_per_second < 0 or flops_token < 0:
        raise ValueError(f"mfu: need peak_flops > 0 and non-negative rates, got tokens/s={tokens_per_second}, "
                         f"flops/token={flops_token}, peak={peak_flops}")
    return tokens_per_second * flops_token / peak_flops
