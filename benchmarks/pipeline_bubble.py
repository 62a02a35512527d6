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

With `--against-naive` it measures the brief's claim, "pipeline parallelism removes 90% of idle
waiting": the same batch run naively (one batch, no micro-batches, one rank working at a time:
GPipe with m = 1) and cut into m micro-batches by GPipe, 1F1B and interleaved 1F1B; each one's
idle fraction over the naive one's, its idle rank-seconds over the naive's, and the fewest
micro-batches that cut the idle fraction by 90%, measured and predicted ((p-1)/(vm+p-1) <=
0.1 (p-1)/p, i.e. vm >= 9p+1). With --sleeping F the batch's stage takes F s forward and 2F
backward in all (each micro-batch 1/m of it); without, the GPT runs on a batch of --batch
sequences (only the m that divide it).

    .venv/bin/python benchmarks/pipeline_bubble.py --against-naive --sleeping 0.4 --ps 4
    .venv/bin/python benchmarks/pipeline_bubble.py --against-naive --ps 4 --batch 40 --layers 8
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
    parser.add_argument("--against-naive", action="store_true",
                        help="each schedule against the naive one on the same batch, and the m that removes 90%% of idle")
    parser.add_argument("--batch", type=int, default=40, help="--against-naive with the GPT: sequences in the batch")
    args = parser.parse_args()
    if args.against_naive:
        against_naive_table(args)
        return
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


def against_naive_table(args) -> None:
    from camplib.parallel.pipeline.bubble import against_naive, compare_with_naive
    from camplib.parallel.pipeline.schedule import micro_batches_for_idle_cut

    schedules = ("gpipe", "1f1b", "interleaved")
    v = args.vs[0]
    what = (f"sleeping stages, one batch = {args.sleeping * 1e3:.0f} ms forward + {2e3 * args.sleeping:.0f} ms backward "
            f"per stage" if args.sleeping is not None else
            f"GPT {args.layers} x d_model {args.d_model}, batch {args.batch} x seq {args.seq}")
    print(f"{os.cpu_count()} cores; {what}; the same batch in every row")
    for p in args.ps:
        wanted = {micro_batches_for_idle_cut(p, 1), micro_batches_for_idle_cut(p, v, multiple_of=p)}
        ms = sorted(set(args.ms) | wanted | {2 * m for m in wanted} | {1})
        if args.sleeping is not None:
            result = against_naive(schedules, p, ms, v, args.sleeping, 2 * args.sleeping, timeout=600)
        else:
            result = compare_with_naive(gpt_rows(args, p, v, [m for m in ms if args.batch % m == 0]), schedules, p, v)
        n = result["naive"]
        print(f"\np = {p}: naive (one batch, no micro-batches): idle {n['measured']:.3f} of the step "
              f"(theory {n['theory']:.3f}), {n['idle_s']:.2f} rank-seconds idle, step {n['step_s']:.2f} s")
        print(f"{'schedule':>11} {'m':>3} {'v':>2} {'idle':>6} {'theory':>6} {'idle/naive':>10} "
              f"{'idle-s/naive':>12} {'step s':>7}")
        for r in sorted(result["rows"], key=lambda r: (schedules.index(r["schedule"]), r["m"])):
            if r["m"] == 1:
                continue                                   # the naive schedule itself
            print(f"{r['schedule']:>11} {r['m']:>3} {r['v']:>2} {r['measured']:6.3f} {r['theory']:6.3f} "
                  f"{r['idle_vs_naive']:10.3f} {r['idle_time_vs_naive']:12.3f} {r['step_s']:7.2f}")
        print(f"fewest micro-batches whose idle fraction is <= 10% of the naive one's (brief: \"pipeline "
              f"parallelism removes 90% of idle waiting\"):")
        top = max(r["m"] for r in result["rows"])
        for name, t in result["threshold"].items():
            got = t["measured"] if t["measured"] is not None else f"not within m <= {top}"
            print(f"  {name:>11} (v={t['v']}): measured m = {got}, predicted m = {t['predicted']}")
        print("fewest micro-batches whose idle rank-seconds are <= 10% of the naive one's (they fall as 1/(vm)):")
        for name, t in result["threshold"].items():
            got = t["time_measured"] if t["time_measured"] is not None else f"not within m <= {top}"
            print(f"  {name:>11} (v={t['v']}): measured m = {got}, predicted m = {t['time_predicted']}")


def gpt_rows(args, p: int, v: int, ms: list[int]) -> list[dict]:
    """Rows as measure_bubbles gives them, from the GPT run by run_pipeline on the same batch."""
    torch.manual_seed(0)
    gpt = GPT(GPTConfig.gpt2_style(n_layer=args.layers, d_model=args.d_model, n_head=4, vocab_size=64,
                                   max_seq_len=args.seq, tie_embeddings=False))
    idx = torch.randint(0, 64, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    rows = []
    for name, chunks in [("gpipe", 1), ("1f1b", 1), ("interleaved", v)]:
        for m in ms:
            if (name == "interleaved" and (m % p or args.layers % (p * chunks))) or (name != "gpipe" and m == 1):
                continue
            out = run_pipeline(gpt, idx, idx, p, m, chunks, name, steps=args.steps, timeout=600)
            bubble, _, _ = measured_bubble(out["events"])
            start = min(s for ev in out["events"] for _, s, _ in ev)
            step = max(e for ev in out["events"] for _, _, e in ev) - start
            rows.append({"schedule": name, "p": p, "m": m, "v": chunks, "measured": bubble,
                         "theory": bubble_theory(p, m, chunks), "step_s": step, "idle_s": bubble * p * step})
    return rows


if __name__ == "__main__":
    main()
