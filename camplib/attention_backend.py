"""Which attention kernel a model runs on: measured once per device, dtype and size, cached, overridable.

`camplib.attention.attend` computes the same function with "math" (b01's explicit matmuls and
softmax) and "sdpa" (torch's fused kernel). Which is faster depends on the machine and the size:
torch's fused CPU kernel is the better one in fp32, but in bf16 on a CPU with AMX the explicit
matmuls (oneDNN's bf16 GEMMs) can beat it on short sequences (issue 25 reported ~30% on a bf16
CPU). Measured, forward + backward of causal attention on a 16-core AMX / AVX512-BF16 CPU (torch
2.11): (4, 4, 128, 32) bf16 math 0.91x sdpa's time (9% faster), but (8, 8, 512, 64) bf16 math
3.4-4.2x sdpa's time, and fp32 math 2.6-5.4x. So `backend="auto"` (GPTConfig's default) asks
`choose(device, dtype, shape)`, and the answer is per size class, not per machine:

"auto" times "matmul" (the same explicit matmuls with torch's softmax kernel) rather than b01's
"math" itself: on a 2-core AMX CPU (torch 2.13, 1 thread), b01's hand-written softmax and mask took
~46 ms of a 131 ms Llama-medium bf16 training step in passes over the (8, 8, 128, 128) scores.

1. an override wins: `prefer(backend, device_type=None, dtype=None)` in code, or the environment
   variable CAMP_ATTENTION=math|matmul|sdpa for the whole process;
2. else reduced precision (bf16, fp16) on a CPU with instructions for it (AVX512-BF16 / AMX /
   AVX512-FP16, as oneDNN reports them) is measured the first time a size class is seen (the
   call's (batch, heads, queries, keys, head_dim), queries and keys rounded up to powers of two;
   forward + backward when gradients are on, else forward): random tensors of that shape through
   each backend, alternating, median of `ROUNDS` after one warm-up, about 8 attention calls once
   per class and process; the faster one is cached with its times (`choices()` shows them);
3. else "sdpa" without measuring: fp32/fp64 on the CPU (the fused kernel wins there), bf16/fp16
   on a CPU that only emulates them (measured on an AVX2 CPU: sdpa 3.7x faster than math in bf16;
   and the measurement itself would take seconds), every dtype on CUDA (FlashAttention /
   memory-efficient kernels), and a size class first seen inside torch.compile's tracing
   (nothing is timed there; a choice measured eagerly before is reused).

Both backends give the same numbers within rounding (tests/camplib/test_attention_backends.py),
so the choice changes speed, not results beyond the last bits. For bit-reproducible bf16 runs
across machines, pin it (CAMP_ATTENTION=sdpa).
"""
from __future__ import annotations

import os
import statistics
import time

import torch

__all__ = ["choose", "prefer", "choices", "measure", "forget", "native_on_cpu", "size_class", "MEASURED_DTYPES",
           "ROUNDS"]

CHOICES = ("math", "matmul", "sdpa")   # what an override may name
MEASURED = ("matmul", "sdpa")          # what "auto" times and picks from
MEASURED_DTYPES = (torch.bfloat16, torch.float16)
ROUNDS = 3
SHAPE = (4, 4, 128, 128, 32)     # (batch, heads, queries, keys, head_dim) when `choose` is given none
ENV = "CAMP_ATTENTION"

_cache: dict[tuple, dict] = {}       # (device type, dtype, size class, backward) -> {"backend", "seconds"}
_preferred: dict[tuple[str | None, torch.dtype | None], str] = {}


def _check(backend: str) -> str:
    if backend not in CHOICES:
        raise ValueError(f"attention backend {backend!r}: choose among {CHOICES}")
    return backend


def prefer(backend: str | None, device_type: str | None = None, dtype: torch.dtype | None = None) -> None:
    """Override the choice for (device_type, dtype); None in either matches any. backend=None
    removes that override."""
    if backend is None:
        _preferred.pop((device_type, dtype), None)
    else:
        _preferred[(device_type, dtype)] = _check(backend)


def forget() -> None:
    """Drop the measured choices and the overrides made with `prefer` (not the environment's)."""
    _cache.clear()
    _preferred.clear()


def choices() -> dict[tuple, dict]:
    """The measured choices so far: {(device type, dtype, (B, H, T, S, D) class, backward):
    {"backend", "seconds": {backend: s}}}."""
    return {key: dict(value) for key, value in _cache.items()}


def size_class(shape: tuple[int, int, int, int, int]) -> tuple[int, int, int, int, int]:
    """(B, H, T, S, D) with T and S rounded up to powers of two: calls that cost about the same."""
    B, H, T, S, D = shape
    return B, H, 1 << max(T - 1, 0).bit_length(), 1 << max(S - 1, 0).bit_length(), D


def measure(device: torch.device | str, dtype: torch.dtype, shape=SHAPE, rounds: int = ROUNDS,
            backward: bool = True, attend=None) -> dict[str, float]:
    """Median seconds of causal attention of shape (B, H, T, S, D) per backend (forward, and
    backward if asked), on `device` in `dtype`, the backends alternating round by round (so that a
    busy machine slows both alike). `attend` is the function timed, `camplib.attention.attend`
    (which hands itself over: this module never imports it, so the two do not import each other)."""
    if attend is None:
        raise ValueError("measure needs the attention function to time: attend=camplib.attention.attend")
    B, H, T, S, D = shape
    g = torch.Generator().manual_seed(0)
    q, grad = (torch.randn(B, H, T, D, generator=g).to(device=device, dtype=dtype) for _ in range(2))
    k, v = (torch.randn(B, H, S, D, generator=g).to(device=device, dtype=dtype) for _ in range(2))
    cuda = torch.device(device).type == "cuda"
    times = {b: [] for b in MEASURED}
    with torch.set_grad_enabled(backward):
        for r in range(rounds + 1):                   # round 0 warms up, untimed
            for backend in (MEASURED if r % 2 == 0 else MEASURED[::-1]):
                leaves = [t.detach().requires_grad_(backward) for t in (q, k, v)]
                if cuda:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                out = attend(*leaves, is_causal=True, backend=backend)
                if backward:
                    out.backward(grad)
                if cuda:
                    torch.cuda.synchronize()
                if r:
                    times[backend].append(time.perf_counter() - start)
    return {b: statistics.median(t) for b, t in times.items()}


_native: dict[torch.dtype, bool] = {}


def native_on_cpu(dtype: torch.dtype) -> bool:
    """Whether this CPU computes `dtype` matrix products natively (oneDNN's own check, cached)."""
    if dtype not in _native:
        check = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}.get(dtype)
        try:
            _native[dtype] = bool(check and getattr(torch.ops.mkldnn, check)())
        except (AttributeError, RuntimeError):
            _native[dtype] = False
    return _native[dtype]


def choose(device: torch.device | str, dtype: torch.dtype, shape=SHAPE, backward: bool = True, attend=None) -> str:
    """"matmul" or "sdpa" (or an override's choice) for attention of `shape` (B, H, T, S, D) on
    `device` in `dtype`, with or without its backward (see the module docstring); `attend` is what
    a measurement times (`camplib.attention.attend` passes itself)."""
    device_type = torch.device(device).type
    for key in ((device_type, dtype), (device_type, None), (None, dtype), (None, None)):
        if key in _preferred:
            return _preferred[key]
    if os.environ.get(ENV):
        return _check(os.environ[ENV])
    if device_type != "cpu" or dtype not in MEASURED_DTYPES:
        return "sdpa"
    key = (device_type, dtype, size_class(tuple(shape)), bool(backward))
    if key in _cache:
        return _cache[key]["backend"]
    if torch.compiler.is_compiling() or not native_on_cpu(dtype):   # never measure inside a compiled graph
        return "sdpa"
    seconds = measure(device, dtype, key[2], backward=bool(backward), attend=attend)
    _cache[key] = {"backend": min(seconds, key=seconds.get), "seconds": seconds}
    return _cache[key]["backend"]
