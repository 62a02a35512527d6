"""SwiGLU's nonlinearity: SiLU written out (the lesson), and the kernel the model trains on.

`silu` / `SiLU` are SiLU from scratch, derivative included, proven equal to
torch.nn.functional.silu (tests/camplib/test_activations.py). The model trains on the faster
kernel (issue 25: a training step should spend its time in the matrix products, not in
element-wise work): `swiglu(gate, up)` = silu(gate) * up through torch's one-kernel F.silu, one
pass forward and one backward where the written-out `silu` takes two and six. Measured in
training steps of the Llama-style configs of benchmarks/train_throughput.py (1 thread, fp32, the
old and new model alternating step by step, median CPU time, an AVX2 CPU): the old step took
1.075-1.10x as long in the small config and 1.05x in the medium one.

GPT-2's tanh GELU, `gelu_tanh`, is computed as x * sigmoid(2 z), z = sqrt(2/pi) (x + 0.044715 x^3)
(the same function: 0.5 (1 + tanh z) = sigmoid(2 z)), in one autograd Function with its derivative
written out, a few in-place passes each way. torch's F.gelu(approximate="tanh") spends most of
its time in tanh, slow on an AVX2 CPU: measured alone on (1024, 512) fp32, 1 thread, forward and
backward took ~5x as long as here; F.gelu was ~12% of GPT-2 small's training step
(benchmarks/train_throughput.py), this ~5%. In whole steps (old and new model alternating, median
CPU time, 1 thread, load 10-15): the old step took 1.05-1.07x as long in GPT-2 small, 1.03x in
medium. (Written as a chain of autograd ops instead, the sigmoid form's temporaries ate the gain:
0.96-1.01x in a whole step.) On a CPU whose torch kernels are AVX512 the balance turns: there,
torch's kernel took 0.65-0.85x this Function's time on (1024, 512) and (1024, 1024), fp32 and bf16,
forward and backward (1 thread). So the model's `gelu(x, "tanh")` takes this Function only where
torch's CPU kernels are AVX2 (`torch.backends.cpu.get_cpu_capability()`), and torch's kernel
elsewhere (AVX512 CPUs, CUDA); both are the same function within rounding (tested).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["silu", "SiLU", "swiglu", "gelu", "gelu_tanh", "written_tanh_gelu_is_faster"]


class _SiLUFunction(torch.autograd.Function):
    """silu(x) = x * sigmoid(x), with its derivative written out. Saves only x (as F.silu does);
    with s = sigmoid(x): d/dx [x s] = s + x s (1 - s) = s (1 + x (1 - s))."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * s * (1 + x * (1 - s))


def silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU, or swish (Elfwing et al. 2017; Ramachandran et al. 2017): x * sigmoid(x), a smooth
    ReLU that dips slightly below zero (min -0.278 at x = -1.278). SwiGLU's gate.

    bf16 / fp16 inputs are computed in fp32 and rounded once at the end, as torch's kernel does
    (torch.nn.functional.silu: tests/camplib/test_activations.py compares values and gradients)."""
    wide = torch.promote_types(x.dtype, torch.float32)
    return _SiLUFunction.apply(x.to(wide)).to(x.dtype)


class SiLU(nn.Module):
    """`silu` as a module (torch.nn.SiLU's place in a Sequential)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu(x)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, SwiGLU's gated hidden layer (Shazeer 2020), on torch's SiLU kernel (the
    same function as `silu`, one pass each way: the model's speed, `silu` the lesson)."""
    return F.silu(gate) * up


_C0 = 2.0 * math.sqrt(2.0 / math.pi)   # 2 z = x * (C0 + C1 x^2)
_C1 = _C0 * 0.044715


class _TanhGELUFunction(torch.autograd.Function):
    """y = x * s, s = sigmoid(x (C0 + C1 x^2)). Saves x and s; with u = x (C0 + C1 x^2),
    dy/dx = s + x s (1 - s) du/dx = s + s (1 - s) x (C0 + 3 C1 x^2). Backward clamps x to +-1e4
    in the polynomial: beyond it s (1 - s) is exactly 0 (or s is), and the unclamped cube would
    overflow to inf and make 0 * inf = NaN where torch's kernel gives 1 or 0."""

    @staticmethod
    def forward(ctx, x):
        s = torch.addcmul(x.new_full((), _C0), x, x, value=_C1).mul_(x).sigmoid_()
        ctx.save_for_backward(x, s)
        return x * s

    @staticmethod
    def backward(ctx, grad):
        x, s = ctx.saved_tensors
        xc = x.clamp(-1e4, 1e4)
        dx = torch.addcmul(x.new_full((), _C0), xc, xc, value=3 * _C1).mul_(xc)
        return dx.mul_(torch.addcmul(s, s, s, value=-1)).add_(s).mul_(grad)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (Hendrycks & Gimpel 2016),
    equal to torch.nn.functional.gelu(x, approximate="tanh") within fp32 rounding (values and
    gradients: tests/camplib/test_activations.py). bf16 / fp16 inputs are computed in fp32 and
    rounded once at the end, as torch's kernel does."""
    wide = torch.promote_types(x.dtype, torch.float32)
    return _TanhGELUFunction.apply(x.to(wide)).to(x.dtype)


def written_tanh_gelu_is_faster(device: torch.device) -> bool:
    """Whether `gelu_tanh`'s written-out Function beats torch's tanh-GELU kernel on `device`:
    on a CPU whose torch kernels are AVX2 (measured there ~5x), not on AVX512 (0.65-0.85x the
    time for torch's) or CUDA (one fused kernel against several passes), nor inside torch.compile
    (inductor fuses torch's GELU into its own kernel)."""
    if torch.compiler.is_compiling():
        return False
    return device.type == "cpu" and torch.backends.cpu.get_cpu_capability() == "AVX2"


def gelu(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """The MLP's GELU: for approximate="tanh" (GPT-2's) the faster of `gelu_tanh` and torch's
    kernel on this machine (`written_tanh_gelu_is_faster`), torch's exact erf kernel (already
    fast) for "none"."""
    if approximate == "tanh":
        return gelu_tanh(x) if written_tanh_gelu_is_faster(x.device) else F.gelu(x, approximate="tanh")
    if approximate == "none":
        return F.gelu(x)
    raise ValueError(f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}")
