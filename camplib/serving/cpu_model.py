"""The model as the serving engine runs it on a CPU: the same weights, fewer and faster kernels.

A decoding step multiplies a few rows of activations (one per sequence in the batch) by every
weight matrix of the model, so on a CPU it is bound by how fast the weights stream through the
caches, and at one or two sequences also by the cost of each operator call from Python (a
Llama layer is ~60 of them). `for_cpu_serving(model)` returns a copy that shares the weights and
swaps three kinds of layer:
- every nn.Linear for a `PackedLinear`: `F.linear` reads the weight in its (out, in) layout on
  every call; oneDNN can first copy it into the blocked layout its matrix kernel reads fastest
  (once, when the server starts) and multiply straight from it. vLLM's CPU backend does the same
  (`onednn_mm` with a weight reordered at load time). On the 2-core AVX2 machine, SmolLM2-135M's
  layers at 16 rows took ~25% less time, its 49152-row LM head ~30% (a one-off measurement,
  recorded in benchmarks/README.md);
- Llama's feed-forward for a `PackedSwiGLU`: gate and up stacked into one matrix (vLLM's
  gate_up_proj), one product instead of two, and torch's one-kernel SiLU;
- RMSNorm for torch's one-call `F.rms_norm` (the same numbers: tests/camplib/serving/test_cpu_model.py).

The products are the same up to rounding (the kernel sums in another order): logits agree with
`F.linear`'s to ~1e-5 relative, so a greedy token can differ where two logits nearly tie. That is
why `Engine` swaps only when asked (`fast_cpu=True`; `camp serve` on a CPU does by default) and
its exactness tests run on the model as given.

`torch.ops.mkldnn._reorder_linear_weight` / `_linear_pointwise` are the operators torch's own
compiler (inductor, with freezing) emits for the same purpose; they exist only in CPU builds with
oneDNN, and `available()` says whether this one has them.
"""
from __future__ import annotations

import copy
import itertools

import torch
import torch.nn.functional as F
from torch import nn

from camplib.model import RMSNorm, SwiGLU

__all__ = ["PackedLinear", "PackedSwiGLU", "OneCallRMSNorm", "available", "for_cpu_serving"]

DTYPES = (torch.float32, torch.bfloat16)


def available(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether weights on `device` in `dtype` can be packed for oneDNN here."""
    return (torch.device(device).type == "cpu" and dtype in DTYPES and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class PackedLinear(nn.Module):
    """`linear(x)` computed from a copy of its weight in oneDNN's layout; shares weight and bias."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


class PackedSwiGLU(nn.Module):
    """Llama's feed-forward with gate and up stacked into one packed (2 d_ff, d) matrix: one
    product instead of two (vLLM's gate_up_proj), then down(silu(gate) * up)."""

    def __init__(self, mlp: SwiGLU):
        super().__init__()
        both = nn.Linear(mlp.gate.in_features, 2 * mlp.gate.out_features, bias=mlp.gate.bias is not None)
        with torch.no_grad():
            both.weight.copy_(torch.cat([mlp.gate.weight, mlp.up.weight]))
            if both.bias is not None:
                both.bias.copy_(torch.cat([mlp.gate.bias, mlp.up.bias]))
        self.gate_up, self.down = PackedLinear(both.to(mlp.gate.weight.dtype)), PackedLinear(mlp.down)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class OneCallRMSNorm(nn.Module):
    """camplib's RMSNorm (same weight, same numbers in fp32) as one call to torch's kernel."""

    def __init__(self, norm: RMSNorm):
        super().__init__()
        self.weight, self.eps = norm.weight, norm.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def for_cpu_serving(model: nn.Module) -> nn.Module:
    """A copy of `model` (in eval mode) that shares its parameters and buffers, with every
    nn.Linear a PackedLinear, every SwiGLU a PackedSwiGLU and every fp32 RMSNorm a OneCallRMSNorm;
    the caller's model is left as it was. Costs one more copy of the weights."""
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    served = copy.deepcopy(model, shared)
    for module in list(served.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, SwiGLU):
                setattr(module, name, PackedSwiGLU(child))
            elif isinstance(child, nn.Linear):
                setattr(module, name, PackedLinear(child))
            elif isinstance(child, RMSNorm) and child.weight.dtype == torch.float32:
                setattr(module, name, OneCallRMSNorm(child))   # in bf16 camplib's norm computes in fp32
    return served.eval()
