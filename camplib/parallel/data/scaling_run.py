"""What the alpha-beta cost model (camplib.parallel.data.cost_model) is checked against: collectives
and data-parallel training steps timed on N gloo ranks of this machine. A rank function plus one
call of camplib.dist.on_ranks each; camplib.parallel.data.cost_model never imports this module.

- `time_all_reduces`: the ring all-reduce of camplib.parallel.data.compression (uncompressed, fp16,
  int8) on messages of several sizes: seconds (the median of `repeats`, the slowest rank's) and
  the bytes a rank sent, counted on the collectives (camplib.dist.count_bytes).
- `time_steps`: a data-parallel MLP step (forward, backward, all-reduce of the flat gradient
  with each method, SGD): the compute alone (no communication, every rank computing at once, so
  that ranks sharing cores are timed as they run) and the whole step, medians; and the bytes
  sent per step.
- `codec_seconds_per_value`: one process's cost of quantizing and dequantizing (int8) or
  casting (fp16) a gradient, per value.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from camplib.dist.counting import count_bytes
from camplib.dist.ranks import on_ranks

from camplib.parallel.data.compression import compressed_all_reduce, dequantize_int8, quantize_int8
from camplib.parallel.data.compression_run import step_with_summed_grads
from camplib.parallel.model_specs import batch_loss, build_model

__all__ = ["time_all_reduces", "time_steps", "codec_seconds_per_value"]


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _timed(fn, repeats: int) -> float:
    """Median over `repeats` of the slowest rank's seconds for fn() (ranks start together)."""
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(_slowest(time.perf_counter() - start))
    return statistics.median(times)


def _all_reduce_rank(rank, world_size, numels, methods, repeats, block):
    out = {"seconds": {}, "bytes_per_call": {}}
    for method in methods:
        for numel in numels:
            x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
            compressed_all_reduce(x.clone(), method, block)                      # warm-up
            with count_bytes() as sent:
                compressed_all_reduce(x.clone(), method, block)
            out["seconds"][f"{method}/{numel}"] = _timed(lambda: compressed_all_reduce(x.clone(), method, block), repeats)
            out["bytes_per_call"][f"{method}/{numel}"] = sent.sent
    return out


def time_all_reduces(world_size: int, numels=(2**12, 2**15, 2**18), methods=("none",), repeats: int = 5,
                     block: int = 256, timeout: float = 120.0) -> dict:
    """{"seconds": {"method/numel": median seconds}, "bytes_per_call": {"method/numel": bytes a rank
    sent}} of the ring all-reduce of `numel` fp32 values on `world_size` gloo ranks."""
    run = on_ranks(_all_reduce_rank, world_size, tuple(numels), tuple(methods), repeats, block, backend="gloo",
                   timeout=timeout)
    return {"seconds": run["seconds"][0], "bytes_per_call": run["bytes_per_call"][0]}


def _steps_rank(rank, world_size, spec, batch, methods, repeats, block):
    model = build_model(spec)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(batch, spec["sizes"][0], generator=g), torch.randn(batch, spec["sizes"][-1], generator=g)

    def compute():
        opt.zero_grad()
        batch_loss(model, spec, x, y).backward()
        return torch.cat([p.grad.reshape(-1) for p in params])

    def step(method):
        flat = compute()
        compressed_all_reduce(flat, method, block)
        step_with_summed_grads(opt, params, flat, world_size)

    compute()                                                     # warm-up
    out = {"compute_s": _timed(compute, repeats), "step_s": {}, "bytes_per_step": {}}
    for method in methods:
        step(method)                                              # warm-up
        with count_bytes() as sent:
            step(method)
        out["bytes_per_step"][method] = sent.sent
        out["step_s"][method] = _timed(lambda: step(method), repeats)
    out["n_params"] = sum(p.numel() for p in params)
    return out


def time_steps(world_size: int, sizes: list[int], batch: int = 32, methods=("none", "int8"), repeats: int = 5,
               block: int = 256, timeout: float = 120.0) -> dict:
    """{"compute_s", "step_s": {method: s}, "bytes_per_step": {method: bytes}, "n_params"} of a
    data-parallel MLP (`sizes`) step on `world_size` gloo ranks (medians of the slowest rank)."""
    spec = {"kind": "mlp", "sizes": list(sizes), "seed": 0}
    run = on_ranks(_steps_rank, world_size, spec, batch, tuple(methods), repeats, block, backend="gloo",
                   timeout=timeout)
    return {key: run[key][0] for key in ("compute_s", "step_s", "bytes_per_step", "n_params")}


def codec_seconds_per_value(method: str, numel: int = 2**18, repeats: int = 5, block: int = 256,
                            device: str = "cpu") -> float:
    """Seconds per value to encode and decode a message of `numel` values with `method`
    ("none": 0), the median of `repeats`, on `device`."""
    if method == "none":
        return 0.0
    x = torch.randn(numel, device=device)

    def codec():
        if method == "int8":
            return dequantize_int8(*quantize_int8(x, block))
        if method == "fp16":
            return x.to(torch.float16).float()
        raise ValueError(f"unknown method {method!r}")

    codec()
    times = []
    for _ in range(repeats):
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        codec()
        if device != "cpu":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) / numel
