"""The pipeline bubble measured on real ranks against the theory, for each (schedule, p, m, v).

camplib's GPT runs as a p-rank pipeline (gloo, CPU, `camplib.parallel.pipeline.run.run_pipeline`)
for a few steps; the last step's recorded actions give, per rank, the time spent computing
(from after an action's receive to after its send is posted). The bubble is the idle share:
1 - (sum of compute) / (p * step time). Theory: (p-1)/(m+p-1) for GPipe and 1F1B,
(p-1)/(v*m+p-1) for interleaved 1F1B; with them the mean forward and backward times and the
measured peak number of micro-batches in flight per rank.

Stage compute is made (nearly) uniform: a wide model with a tiny vocabulary, so the embedding
on the first stage and the head on the last cost little next to the blocks, and p * v divides
the layers. (With uniform stages the simulator gives exactly the theory: the test of the
schedules checks that, so only the measurement is printed here.) Each rank needs its own cores: with fewer cores than ranks they time-share, and an
"idle" rank lends its core to a busy one, which hides the bubble. Run it on a machine with at
least p cores (it prints the core count).

    .venv/bin/python benchmarks/pipeline_bubble.py [--ps 2 4] [--ms 1 2 4 8] [--vs 2] [--layers 8]

With `--sleeping F` the stages are `camplib.parallel.pipeline.bubble.SleepStage`s instead (F
seconds a forward, 2F a backward): uniform whatever the cores or the load, so any machine
measures the schedule and its messages. Each message on the critical path adds a wake-up (a
few ms on a loaded machine), so the measured bubble nears the theory as F grows.

    .venv/bin/python benchmarks/pipeline_bubble.py --sleeping 0.5 --ms 2 4 8
"""
from __future__ import annotations

import argparse
import os

import torch

from camplib.model import GPT, GPTConfig
from camplib.parallel.pipeline.run import run_pipeline
from camplib.parallel.pipeline.schedule import bubble_theory


def measured_bubble(events: list) -> tuple[float, float, float]:
    """(bubble, mean forward seconds, mean backward seconds) of one step's per-rank events."""
    start = min(s for ev in events for _, s, _ in ev)
    end = max(e for ev in events for _, _, e in ev)
    busy = sum(e - s for ev in events for _, s, e in ev)
    f = [e - s for ev in events for a, s, e in ev if a[0] == "F"]
    b = [e - s for ev in events for a, s, e in ev if a[0] == "B"]
    return 1 - busy / (len(events) * (end - start)), sum(f) / len(f), sum(b) / len(b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ps", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--ms", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--vs", type=int, nargs="+", default=[2], help="chunks per rank for interleaved")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=2, help="sequences per micro-batch")
    parser.add_argument("--steps", type=int, default=3, help="steps per run; the last one is measured")
    parser.add_argument("--sleeping", type=float, default=None, metavar="F",
                        help="stages that sleep F s a forward and 2F a backward instead of the GPT")
    args = parser.parse_args()
    if args.sleeping is not None:
        sleeping(args)
        return
    torch.manual_seed(0)
    gpt = GPT(GPTConfig.gpt2_style(n_layer=args.layers, d_model=args.d_model, n_head=4, vocab_size=64,
                                   max_seq_len=args.seq, tie_embeddings=False))
    print(f"{os.cpu_count()} cores; GPT {args.layers} x d_model {args.d_model}, seq {args.seq}, "
          f"{args.micro_batch} sequences per micro-batch; bubble = idle / (p * step time)")
    print(f"{'schedule':>11} {'p':>2} {'m':>2} {'v':>2} {'measured':>9} {'theory':>7} {'ratio':>6} "
          f"{'fwd ms':>7} {'bwd ms':>7}  peak in flight")
    for p in args.ps:
        for name, v in [("gpipe", 1), ("1f1b", 1)] + [("interleaved", v) for v in args.vs]:
            for m in args.ms:
                if name == "interleaved" and (m % p or args.layers % (p * v)):
                    continue
                batch = m * args.micro_batch
                g = torch.Generator().manual_seed(m)
                idx = torch.randint(0, 64, (batch, args.seq), generator=g)
                out = run_pipeline(gpt, idx, idx, p, m, v, name, steps=args.steps, timeout=120)
                bubble, tf, tb = measured_bubble(out["events"])
                theory = bubble_theory(p, m, v)
                ratio = bubble / theory if theory else float("nan")
                print(f"{name:>11} {p:>2} {m:>2} {v:>2} {bubble:9.3f} {theory:7.3f} {ratio:6.2f} "
                      f"{tf * 1e3:7.2f} {tb * 1e3:7.2f}  {out['peak_in_flight']}")


def sleeping(args) -> None:
    from camplib.parallel.pipeline.bubble import measure_bubbles

    print(f"{os.cpu_count()} cores; sleeping stages, {args.sleeping * 1e3:.0f} ms a forward, "
          f"{2 * args.sleeping * 1e3:.0f} ms a backward; bubble = idle / (p * step time)")
    print(f"{'schedule':>11} {'p':>2} {'m':>2} {'v':>2} {'measured':>9} {'theory':>7} {'ratio':>6} {'step s':>7}")
    for v in args.vs:
        rows = measure_bubbles(["gpipe", "1f1b", "interleaved"], ps=args.ps, ms=args.ms, v=v,
                               forward_s=args.sleeping, backward_s=2 * args.sleeping, timeout=600)
        for r in rows:
            if r["schedule"] != "interleaved" and v != args.vs[0]:
                continue
            print(f"{r['schedule']:>11} {r['p']:>2} {r['m']:>2} {r['v']:>2} {r['measured']:9.3f} "
                  f"{r['theory']:7.3f} {r['measured'] / r['theory']:6.2f} {r['step_s']:7.1f}")


if __name__ == "__main__":
    main()
