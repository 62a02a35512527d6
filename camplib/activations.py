"""SwiGLU's nonlinearity: SiLU written out (the lesson), and the kernel the model trains on.

`silu` / `SiLU` are SiLU from scratch, derivative included, proven equal to
torch.nn.functional.silu (tests/camplib/test_activations.py). The model trains on the faster
kernel (issue 25: a training step should spend its time in the matrix products, not in
element-wise work): `swiglu(gate, up)` = silu(gate) * up through torch's one-kernel F.silu, one
pass forward and one backward where the written-out `silu` takes two and six. Measured in
training steps of the Llama-style configs of benchmarks/train_throughput.py (1 thread, fp32, the
old and new model alternating step by step, median CPU time, an AVX2 CPU): the old step took
1.075-1.10x as long in the small config and 1.05x in the medium one.

GPT-2's tanh GELU stays torch's F.gelu: computing it as x * sigmoid(2 z) (the same function,
0.5 (1 + tanh z) = sigmoid(2 z)) is 2x faster alone on an AVX2 CPU (torch's tanh is slow there),
but measured in a whole training step the extra temporaries ate the gain (0.96-1.01x).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["silu", "SiLU", "swiglu"]


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
