"""Lead for issue 25, measured and not adopted yet: the serving engine's whole decoding step
compiled by inductor, against the same step eager, alternating in one process.

SmolLM2-135M-Instruct in fp32 (the transformers folder serve_vs_vllm.py writes), `Engine(fast_cpu=True)`,
B of serve_vs_vllm's prompts prefilled, then one decoding step's batch replayed: `paged_forward`
eager, and the same function through `torch.compile(dynamic=False)` with inductor's freezing (the
packed oneDNN products need their weights as graph constants: without freezing the lowering of
`mkldnn._linear_pointwise` fails), `--cpp-wrapper` for inductor's C++ wrapper instead of its
Python one. Printed: compile seconds, the largest logit difference and whether the greedy tokens
agree, then CPU ms per step (median of 15), eager and compiled, `--rounds` times.

In the compiled step the KV pool's write and gather run as opaque custom operators
(`campbench::kv_write`, which mutates the pool, and `campbench::kv_gather`; the eager step is the
engine's own, `PagedKVPool`'s methods). Traced as they are (`index_copy_` into a view of
the pool), functionalization copied the pool: the compiled step took 896 ms against 55 eager.

Why it is not in the engine yet: a compile is per shape (rows B, blocks per sequence W, and each
prefill's chunk lengths), 24-35 s each on this CPU, so the engine would need buckets with padding
rows, precompiled at start or compiled off the serving thread, and an eager fallback meanwhile.

    .venv/bin/python benchmarks/serve_compiled_step.py [--batch 16] [--cpp-wrapper] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_engine_step import decoding_engine  # noqa: E402  (the same engine, prompts and weights)
from serve_vs_vllm import export_folder  # noqa: E402


@torch.library.custom_op("campbench::kv_write", mutates_args=("pool_k", "pool_v"))
def kv_write(pool_k: torch.Tensor, pool_v: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    pool_k.view(-1, *pool_k.shape[-2:]).index_copy_(0, slots, k)
    pool_v.view(-1, *pool_v.shape[-2:]).index_copy_(0, slots, v)


@torch.library.custom_op("campbench::kv_gather", mutates_args=())
def kv_gather(pool_k: torch.Tensor, pool_v: torch.Tensor, tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    B, W = tables.shape
    flat = tables.reshape(-1)
    shape = (B, W * pool_k.shape[1], *pool_k.shape[-2:])
    return pool_k.index_select(0, flat).view(shape), pool_v.index_select(0, flat).view(shape)


@kv_gather.register_fake
def _(pool_k, pool_v, tables):
    B, W = tables.shape
    shape = (B, W * pool_k.shape[1], *pool_k.shape[-2:])
    return pool_k.new_empty(shape), pool_v.new_empty(shape)


class OpaquePool:
    """The engine's pool (the same tensors) with write and gather through the custom operators."""

    def __init__(self, pool):
        self.k, self.v, self.block_size = pool.k, pool.v, pool.block_size

    def write(self, layer, k, v, slots):
        kv_write(self.k[layer], self.v[layer], k.contiguous(), v.contiguous(), slots)

    def gather(self, layer, tables):
        k, v = kv_gather(self.k[layer], self.v[layer], tables)
        return k.transpose(1, 2), v.transpose(1, 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpp-wrapper", action="store_true")
    ap.add_argument("--folder", default=os.path.join(tempfile.gettempdir(), "camp-smollm2-hf"))
    args = ap.parse_args()

    import torch._inductor.config as inductor_config

    from camplib.serving.paged_model import paged_forward

    engine, _ = decoding_engine(str(export_folder(Path(args.folder))), args.batch)
    engine.step()
    rows = engine.scheduler.schedule()   # the next step's rows: all decoding
    batch = engine._batch(sorted(rows, key=lambda r: not engine._is_decode(*r)))
    model, opaque = engine.model, OpaquePool(engine.pool)

    def eager(tokens, positions, slots, tables, mask):   # the engine's own step
        batch.tokens, batch.positions, batch.slots, batch.tables, batch.context_mask = tokens, positions, slots, tables, mask
        return paged_forward(model, engine.pool, batch)

    def to_compile(tokens, positions, slots, tables, mask):
        batch.tokens, batch.positions, batch.slots, batch.tables, batch.context_mask = tokens, positions, slots, tables, mask
        return paged_forward(model, opaque, batch)
    inputs = (batch.tokens, batch.positions, batch.slots, batch.tables, batch.context_mask)

    with torch.no_grad():
        eager_logits = eager(*inputs)   # also resolves the attention backend eagerly
        inductor_config.freezing = True
        inductor_config.cpp_wrapper = args.cpp_wrapper
        start = time.time()
        compiled = torch.compile(to_compile, dynamic=False)
        logits = compiled(*inputs)
        print(f"SmolLM2-135M-Instruct fp32, one decoding step of {args.batch} sequences, one core, 1 thread, "
              f"inductor with freezing, {'C++' if args.cpp_wrapper else 'Python'} wrapper: compile {time.time() - start:.0f} s; "
              f"largest logit difference {(logits - eager_logits).abs().max().item():.2e}; greedy tokens agree: "
              f"{torch.equal(logits.argmax(-1), eager_logits.argmax(-1))}")

        def cpu_ms(f, n=15):
            times = []
            for _ in range(n):
                t = time.process_time()
                f(*inputs)
                times.append(time.process_time() - t)
            return 1e3 * statistics.median(times)
        for r in range(args.rounds):
            e, c = cpu_ms(eager), cpu_ms(compiled)
            print(f"round {r}: eager {e:.1f} ms, compiled {c:.1f} ms, compiled / eager {c / e:.3f}  load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
