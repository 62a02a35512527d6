"""The engine's decoding step compiled once by torch's compiler (inductor), for any batch size.

A decoding step on a CPU is bound by streaming the weights, but between the products sit ~30
small operators per layer (norms, RoPE, SiLU, residual adds, the KV write and gather), each a
Python call and a dispatch that refetch code and data the products evicted from the caches.
vLLM's CPU backend runs that part as a compiled graph; so can the engine. `CompiledDecode`
compiles `paged_forward` (the same function the eager step runs) for steps whose rows all
decode, with inductor's freezing (the weights become constants, so its oneDNN products read
weights packed once) and its C++ wrapper (no Python between the kernels):
- one compile serves every step: the number of rows B and the blocks per sequence W are
  dynamic sizes (`torch._dynamo.mark_dynamic`), compiled "size-oblivious" (the compiler would
  otherwise treat a size of 1 as a constant and compile again for a step of one block); SDPA's
  meta function still asks for B >= 2, so a step of one row runs as two copies of it;
- the KV pool's write and gather are opaque operators (`torch.library.custom_op`): traced as
  they are, `index_copy_` into a view of the pool was turned into copies of the whole pool
  (896 ms a step against 55 eager, benchmarks/README.md);
- steps with prompt chunks (their lengths vary) stay eager, and so does any step the compiled
  graph would have to be compiled again for (`fail_on_recompile`: never a compile stall while
  serving); if compiling fails, the engine warns and runs eager. `fullgraph=True`: the whole step
  is one graph or the compile fails (so is a ninth engine in one process: dynamo keeps at most
  `recompile_limit` = 8 compiled versions of one function).
The compile takes ~40-60 s for SmolLM2-135M on one core, once, when the engine starts. Logits
agree with the eager step's up to rounding (~6e-5 on SmolLM2); a greedy token can differ where
two logits nearly tie, which is why it is opt-in (`Engine(compile_decode=True)`,
`camp serve --compile`). Measured on SmolLM2, one core: 0.90-0.915x the eager step's CPU time at
16 sequences, 0.91-0.93x at one (benchmarks/serve_compiled_step.py); served side by side with
vLLM's CPU build, 1.02-1.05x its tokens/s at 16 clients (benchmarks/serve_vs_vllm.py).
"""
from __future__ import annotations

import time
import warnings

import torch
import torch._inductor.config as inductor_config
from torch.fx.experimental import _config as fx_config

from camplib.serving.kv_pool import gather_layer, write_layer
from camplib.serving.paged_model import StepBatch, paged_forward

__all__ = ["CompiledDecode"]


@torch.library.custom_op("camplib::kv_write", mutates_args=("pool_k", "pool_v"))
def kv_write(pool_k: torch.Tensor, pool_v: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor) -> None:
    """kv_pool.write_layer as one opaque operator."""
    write_layer(pool_k, pool_v, k, v, slots)


@torch.library.custom_op("camplib::kv_gather", mutates_args=())
def kv_gather(pool_k: torch.Tensor, pool_v: torch.Tensor, tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_pool.gather_layer as one opaque operator."""
    return gather_layer(pool_k, pool_v, tables)


@kv_gather.register_fake
def _(pool_k, pool_v, tables):
    B, W = tables.shape
    shape = (B, W * pool_k.shape[1], *pool_k.shape[-2:])
    return pool_k.new_empty(shape), pool_v.new_empty(shape)


class _OpaquePool:
    """A PagedKVPool's tensors, written and gathered through the opaque operators."""

    def __init__(self, pool):
        self.k, self.v, self.block_size = pool.k, pool.v, pool.block_size

    def write(self, layer, k, v, slots):
        kv_write(self.k[layer], self.v[layer], k.contiguous(), v.contiguous(), slots)

    def gather(self, layer, tables):
        k, v = kv_gather(self.k[layer], self.v[layer], tables)
        return k.transpose(1, 2), v.transpose(1, 2)


class CompiledDecode:
    """`paged_forward` for all-decode steps, compiled once: `compile()`, then `run(batch)` per step."""

    def __init__(self, model, pool):
        self.model, self.pool = model, pool
        self._opaque = _OpaquePool(pool)
        self._compiled = None
        self.seconds = None    # the compile's wall time
        self.runs = 0          # steps run compiled
        self.fallbacks = 0     # all-decode steps that ran eager because the graph did not fit them

    def _forward(self, tokens, positions, slots, tables, mask):
        batch = StepBatch(tokens, positions, slots, tokens.shape[0], [], tables, mask)
        return paged_forward(self.model, self._opaque, batch)

    @torch.no_grad()
    def compile(self) -> bool:
        """Compile on a dummy step (2 rows of token 0 in block 0, which no sequence holds yet:
        a sequence's slot is written before it is read); False (with a warning) where it cannot."""
        device, bs = self.pool.k.device, self.pool.block_size
        long = dict(dtype=torch.long, device=device)
        mask = torch.zeros(2, 1, 1, 2 * bs, dtype=self.pool.k.dtype, device=device)
        mask[..., 1:] = float("-inf")
        inputs = (torch.zeros(2, **long), torch.zeros(2, **long), torch.zeros(2, **long), torch.zeros(2, 2, **long), mask)
        for t in inputs:   # B
            torch._dynamo.mark_dynamic(t, 0)
        torch._dynamo.mark_dynamic(inputs[3], 1)   # W
        torch._dynamo.mark_dynamic(inputs[4], 3)   # W * block_size
        start = time.perf_counter()
        try:
            compiled = torch.compile(self._forward, dynamic=False, fullgraph=True)   # all of it, or an error
            # set for the compile itself (it happens at this first call): freezing is read before
            # inductor's own options apply, and without it the packed oneDNN products do not lower
            with inductor_config.patch(freezing=True, cpp_wrapper=device.type == "cpu"), \
                    fx_config.patch(backed_size_oblivious=True):
                compiled(*inputs)
        except Exception as e:   # no compiler, an unsupported operator: the eager step still serves
            warnings.warn(f"the decoding step could not be compiled ({type(e).__name__}: {str(e)[:300]}); "
                          f"serving it eager", RuntimeWarning, stacklevel=2)
            return False
        self.seconds = time.perf_counter() - start
        self._compiled = compiled
        return True

    def run(self, batch: StepBatch) -> torch.Tensor | None:
        """Logits of an all-decode step through the compiled graph; None where it would need a
        new compile (the caller runs the step eager)."""
        if self._compiled is None or batch.chunks:
            return None
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                inputs = (batch.tokens, batch.positions, batch.slots, batch.tables, batch.context_mask)
                if batch.n_decode == 1:   # twice the one row (the same key to the same slot): see compile()
                    inputs = tuple(torch.cat([t, t]) for t in inputs)
                logits = self._compiled(*inputs)[:batch.n_decode]
            self.runs += 1
            return logits
        except RuntimeError as e:   # torch 2.13 raises a plain RuntimeError for the stance
            if not str(e).startswith("Detected recompile"):
                raise
            self.fallbacks += 1
            return None
