"""LayerNorm followed by GELU, eager and fused by torch.compile.

Eagerly, each op is its own kernel: LayerNorm reads x and writes y, GELU reads y and writes the
result, so the activation crosses memory twice more than needed. Such element-wise chains are
memory-bound; torch.compile (TorchInductor) fuses them into one kernel that reads x once and
writes once (Triton on a GPU, C++/OpenMP on the CPU). benchmarks/memory_speed.py measures it.

Compiling needs a working compiler toolchain (a C++ compiler on the CPU, Triton on CUDA) and
takes seconds to tens of seconds. `compile_layernorm_gelu` therefore compiles and runs once up
front; when that fails it returns the eager function together with the reason, so a caller can
say "not fused, because ..." instead of timing the eager path and calling it fused.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

__all__ = ["layernorm_gelu", "FusedFunction", "compile_layernorm_gelu"]


def layernorm_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float = 1e-5,
                   approximate: str = "tanh") -> torch.Tensor:
    """The eager reference: gelu(layer_norm(x)) over the last dimension, one kernel per op."""
    return F.gelu(F.layer_norm(x, (x.shape[-1],), weight, bias, eps), approximate=approximate)


@dataclass
class FusedFunction:
    """`fn` computes layernorm_gelu; `fused` says whether it is the compiled kernel, and when it
    is not, `reason` says why (the eager function is then used)."""
    fn: Callable[..., torch.Tensor]
    fused: bool
    reason: str = ""
    compile_seconds: float = 0.0

    def __call__(self, *args, **kwargs) -> torch.Tensor:
        return self.fn(*args, **kwargs)


def compile_layernorm_gelu(example_x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                           eps: float = 1e-5, approximate: str = "tanh", enabled: bool = True,
                           dynamic: bool = False) -> FusedFunction:
    """torch.compile(layernorm_gelu, fullgraph=True), compiled now by one call on the example
    inputs (torch.compile is lazy: errors would otherwise surface at the first real call).
    Inputs of another shape recompile (dynamic=False) unless dynamic=True."""
    import time

    if not enabled:
        return FusedFunction(layernorm_gelu, False, "compilation disabled by the caller")
    start = time.perf_counter()
    try:
        compiled = torch.compile(layernorm_gelu, fullgraph=True, dynamic=dynamic)
        compiled(example_x, weight, bias, eps, approximate)
    except Exception as exc:  # no compiler, no Triton, an unsupported backend...
        return FusedFunction(layernorm_gelu, False, f"torch.compile failed: {type(exc).__name__}: "
                                                    f"{str(exc).splitlines()[0] if str(exc) else ''}"[:300])
    return FusedFunction(compiled, True, "", time.perf_counter() - start)
