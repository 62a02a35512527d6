"""The serving engine's decoding step alone (no HTTP): CPU ms per step at B sequences, with and
without transparent huge pages, processes alternating; `--profile` adds torch.profiler's top
operators over 10 steps. Huge pages were tried for the server (each step streams ~540 MB of
weights: 135,000 pages of 4 KB) and not adopted: 1.01x at load 5 (benchmarks/README.md).

SmolLM2-135M-Instruct in fp32 (the transformers folder serve_vs_vllm.py writes), `Engine(fast_cpu=True)`,
B of serve_vs_vllm's prompts prefilled, then 40 decoding steps timed one by one (process CPU time,
one thread; the median is printed). Each process is started with THP_MEM_ALLOC_ENABLE=1 or =0
(torch reads it once, at its first large allocation), `--rounds` times each, alternating, pinned to
`--core`; the greedy tokens of both kinds are compared.

    .venv/bin/python benchmarks/serve_engine_step.py [--batch 16] [--rounds 3] [--profile]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_vs_vllm import PROMPTS, export_folder  # noqa: E402  (the same prompts and weights)


def decoding_engine(folder: str, batch: int, compile_decode: bool = False):
    """(engine, sequences): SmolLM2 fp32 from `folder` in `Engine(fast_cpu=True)` on one thread
    (`compile_decode` as given), `batch` of the prompts prefilled, every sequence decoding from
    the next step on."""
    import torch

    from camplib.serving.engine import Engine
    from camplib.serving.loading import load_hf
    from camplib.serving.sequence import SamplingParams

    torch.set_num_threads(1)
    served = load_hf(folder)
    engine = Engine(served.model.float(), max_batch=batch, fast_cpu=True, compile_decode=compile_decode)
    seqs = [engine.add(served.encode(p), SamplingParams(max_tokens=200)) for p in PROMPTS[:batch]]
    engine.step()   # the prefill
    return engine, seqs


def one_process(folder: str, batch: int, profile: bool) -> dict:
    engine, seqs = decoding_engine(folder, batch)
    times = []
    for _ in range(40):
        start = time.process_time()
        engine.step()
        times.append(time.process_time() - start)
    out = {"median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times),
           "tokens": [s.output for s in seqs], "load": os.getloadavg()[0]}
    if profile:
        from torch.profiler import profile as torch_profile
        with torch_profile() as prof:
            for _ in range(10):
                engine.step()
        out["profile"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--core", type=int, default=os.cpu_count() - 1)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--folder", default=os.path.join(tempfile.gettempdir(), "camp-smollm2-hf"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_process(args.folder, args.batch, args.profile)))
        return 0
    folder = str(export_folder(Path(args.folder)))
    print(f"SmolLM2-135M-Instruct fp32, engine alone, {args.batch} sequences decoding, core {args.core}, 1 thread; "
          f"CPU ms per step (median of 40)")
    results = {"1": [], "0": []}
    for r in range(args.rounds):
        for thp in ("1", "0"):
            cmd = ["taskset", "-c", str(args.core), sys.executable, __file__, "--child", "--folder", folder,
                   "--batch", str(args.batch), *(["--profile"] if args.profile and r == 0 else [])]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "THP_MEM_ALLOC_ENABLE": thp}
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            res = json.loads(done.stdout.strip().splitlines()[-1])
            results[thp].append(res)
            print(f"round {r} huge pages {'on ' if thp == '1' else 'off'}  median {res['median_ms']:7.1f}  "
                  f"min {res['min_ms']:7.1f}  per token {res['median_ms'] / args.batch:5.2f}  load {res['load']:.1f}",
                  flush=True)
            if "profile" in res:
                print(res["profile"])
    on, off = ([x["median_ms"] for x in results[k]] for k in ("1", "0"))
    same = all(a["tokens"] == b["tokens"] for a, b in zip(results["1"], results["0"]))
    print(f"huge pages on {min(on):.1f}-{max(on):.1f} ms, off {min(off):.1f}-{max(off):.1f} ms; "
          f"ratio of medians {statistics.median(on) / statistics.median(off):.2f}x; greedy tokens identical: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
