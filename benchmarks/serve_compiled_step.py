"""The serving engine's compiled decoding step (`Engine(compile_decode=True)`,
camplib.serving.compiled_step) against its eager step, on the same batches, alternating in one process.

SmolLM2-135M-Instruct in fp32 (the transformers folder serve_vs_vllm.py writes),
`Engine(fast_cpu=True, compile_decode=True)` on one thread: the engine compiles its decoding
step once, for every batch size and table width (inductor with freezing and its C++ wrapper; the
KV pool's write and gather as opaque operators). Then for each `--batch` B: B of serve_vs_vllm's
prompts prefilled and one decoding step's batch replayed, `paged_forward` eager against
`CompiledDecode.run` (B = 1 runs as two copies of its one row). Printed: the compile's seconds, per B the
largest logit difference and whether the greedy tokens agree, then CPU ms per step (median of
15), eager and compiled, `--rounds` times, and whether any step needed a second compile.

    .venv/bin/python benchmarks/serve_compiled_step.py [--batch 16,1] [--rounds 3]
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


def cpu_ms(f, n: int = 15) -> float:
    times = []
    for _ in range(n):
        start = time.process_time()
        f()
        times.append(time.process_time() - start)
    return 1e3 * statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="16,1", help="sequences per step, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--folder", default=os.path.join(tempfile.gettempdir(), "camp-smollm2-hf"))
    args = ap.parse_args()

    from camplib.serving.paged_model import paged_forward
    from camplib.serving.sequence import SamplingParams

    sizes = [int(b) for b in args.batch.split(",")]
    engine, seqs = decoding_engine(str(export_folder(Path(args.folder))), max(sizes), compile_decode=True)
    prompts = [s.prompt for s in seqs]
    compiled = engine.compiled
    if compiled is None:
        print("NOT RUN: the decoding step did not compile here (see the warning above)")
        return 2
    print(f"SmolLM2-135M-Instruct fp32, one core, 1 thread; the engine compiled its decoding step in "
          f"{compiled.seconds:.0f} s (inductor, freezing, C++ wrapper); CPU ms per step, median of 15")
    with engine.lock:
        for s in seqs:
            engine.scheduler.finish(s, "abort")
    for size in sizes:
        seqs = [engine.add(p, SamplingParams(max_tokens=200)) for p in prompts[:size]]
        engine.step()   # the prefill: the next step's rows all decode
        with engine.lock:
            batch = engine._batch(engine.scheduler.schedule())
        with torch.no_grad():
            eager_logits, compiled_logits = paged_forward(engine.model, engine.pool, batch), compiled.run(batch)
            print(f"{size} sequences ({batch.tables.shape[1]} blocks each): largest logit difference "
                  f"{(compiled_logits - eager_logits).abs().max().item():.2e}, greedy tokens agree: "
                  f"{torch.equal(compiled_logits.argmax(-1), eager_logits.argmax(-1))}")
            for r in range(args.rounds):
                e = cpu_ms(lambda: paged_forward(engine.model, engine.pool, batch))
                c = cpu_ms(lambda: compiled.run(batch))
                print(f"  round {r}: eager {e:.1f} ms, compiled {c:.1f} ms, compiled / eager {c / e:.3f}  "
                      f"load {os.getloadavg()[0]:.1f}")
        with engine.lock:
            for s in seqs:
                engine.scheduler.finish(s, "abort")
    print(f"steps that needed another compile (ran eager): {compiled.fallbacks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
