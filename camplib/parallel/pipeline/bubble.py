"""The pipeline bubble measured on real ranks, with stage compute made uniform, against the
theory (p-1)/(v*m+p-1). A runner: a rank function plus one call of camplib.dist.on_ranks.

The schedule simulator (`pipeline.schedule.simulate`) gives exactly the theory, but it is a
model. Here the course's own `pipeline_step` runs each schedule on p gloo ranks, with its real
sends, receives and timeouts, and records each action's start and end per rank (after the
receive, after the send is posted). The bubble is the idle share of the step:
1 - (sum of the ranks' compute) / (p * step time), the step running from the first action's
start on any rank to the last action's end.

Why stages that sleep: the formula assumes every stage takes the same time per micro-batch. A
real model's stages do not (the embedding, the head), and on a machine with fewer cores than
ranks (or a loaded one) an idle rank lends its core to a busy one, which hides the bubble. A
`SleepStage` takes `forward_s` for a forward and `backward_s` for a backward whatever the load,
so what is measured is the schedule and the messages, not the CPU.

    rows = measure_bubbles(["gpipe", "1f1b"], ps=[2, 4], ms=[1, 2, 4, 8])
    rows[0]   # {"schedule", "p", "m", "v", "measured", "theory", "step_s", "idle_s"}

Against the naive schedule (`against_naive`): the same batch, whose stage takes `forward_s` /
`backward_s` in all, run as one batch with no micro-batches, one rank working at a time (GPipe
with m = 1), and cut into m micro-batches (each action then sleeps 1/m of it) by each schedule;
how much of the naive idle time each removes, measured, and the fewest micro-batches that remove
90% of it, measured and predicted (`pipeline_schedule.micro_batches_for_idle_cut`).
"""
from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist
import torch.fx.experimental.symbolic_shapes  # noqa: F401  (as pipeline.run: imported once, before the fork)
from torch import nn

from camplib.dist import on_ranks
from camplib.parallel.pipeline.stages import pipeline_step
from camplib.parallel.pipeline.comm import PipelineComm
from camplib.parallel.pipeline.schedule import (as_actions, bubble_theory, build_schedule, check_schedule,
                                                micro_batches_for_idle_cut, stage_of)

__all__ = ["SleepStage", "against_naive", "bubble_of_events", "compare_with_naive", "measure_bubbles"]

ACTIVATION = (1, 4)   # the tiny activation the sleeping stages pass on


class _SleepInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


class SleepStage(nn.Module):
    """Stage `index` of `n_stages` whose forward takes `forward_s` seconds and backward
    `backward_s` (sleeps): uniform compute whatever the CPU does. One scalar weight, so backward
    runs and reaches the previous stage; the last stage returns a scalar loss."""

    def __init__(self, index: int, n_stages: int, forward_s: float, backward_s: float):
        super().__init__()
        self.index, self.n_stages = index, n_stages
        self.is_first, self.is_last = index == 0, index == n_stages - 1
        self.forward_s, self.backward_s = forward_s, backward_s
        self.weight = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor, targets=None) -> torch.Tensor:
        time.sleep(self.forward_s)
        y = _SleepInBackward.apply(x * self.weight, self.backward_s)
        return y.sum() if self.is_last else y


def bubble_of_events(events: list) -> tuple[float, float]:
    """(bubble, step seconds) of one step's per-rank [(action, start, end)] lists."""
    start = min(s for ev in events for _, s, _ in ev)
    end = max(e for ev in events for _, _, e in ev)
    busy = sum(e - s for ev in events for _, s, e in ev)
    return 1.0 - busy / (len(events) * (end - start)), end - start


def _bubble_rank(rank: int, world_size: int, cases: list, forward_s: float, backward_s: float, timeout: float,
                 split: bool = False):
    out = []
    for name, p, m, v in [cases[0]] + cases:          # the first case twice: a warm-up, dropped
        dist.barrier()                                 # every case starts on all ranks together
        if rank >= p:
            out.append([])
            continue
        share = v * (m if split else 1)                # split: the batch's time is cut over the micro-batches
        stages = {c: SleepStage(stage_of(rank, c, p), p * v, forward_s / share, backward_s / share) for c in range(v)}
        actions = as_actions(build_schedule(name, p, m, v))[rank]
        micro = [(torch.ones(ACTIVATION), None) for _ in range(m)]
        comm = PipelineComm(rank, p, p * v, ACTIVATION, torch.float32, timeout)
        events = []
        pipeline_step(stages, actions, micro, comm, events)
        out.append([(tuple(a), s, e) for a, s, e in events])
    return {"events": out[1:]}


def measure_bubbles(schedules=("gpipe", "1f1b"), ps=(2, 4), ms=(1, 2, 4, 8), v: int = 2,
                    forward_s: float = 0.03, backward_s: float = 0.06, timeout: float = 60.0,
                    retry_above: float | None = None, attempts: int = 1, split: bool = False) -> list[dict]:
    """One step of each (schedule, p, m) with sleeping stages, all on one launch of max(ps) ranks
    (a case on p ranks leaves the others waiting at the next barrier). "interleaved" runs with
    v chunks per rank where its schedule exists (m a multiple of p). Rows: "schedule", "p", "m",
    "v", "measured", "theory", "step_s", "idle_s" (rank-seconds idle: p * step - busy), "attempts".
    With `split`, forward_s and backward_s are a whole batch's, cut over each case's m
    micro-batches (the same work in every case); otherwise each micro-batch takes them.

    What the sleeps cannot make uniform is the machine's latency: each message on the critical
    path (GPipe's backward chain has zero slack) adds a receive's wake-up to the step, ~0.1 ms on
    a quiet machine, a few ms on an overloaded one. With `retry_above` (a relative error, 0.1 for
    10%) the cases further than that from theory are measured again, up to `attempts` times in
    all, keeping each case's smallest bubble (interference adds idle time: the minimum of
    repeated timings is the usual estimate)."""
    return _measure_cases(_cases(schedules, ps, ms, v), forward_s, backward_s, timeout, retry_above, attempts, split)


def _measure_cases(cases, forward_s, backward_s, timeout, retry_above, attempts, split) -> list[dict]:
    rows = _measure_once(cases, forward_s, backward_s, timeout, split)
    for _ in range(attempts - 1):
        if retry_above is None:
            break
        again = [i for i, r in enumerate(rows) if abs(r["measured"] - r["theory"]) > retry_above * r["theory"]]
        if not again:
            break
        cases = [(rows[i]["schedule"], rows[i]["p"], rows[i]["m"], rows[i]["v"]) for i in again]
        for i, new in zip(again, _measure_once(cases, forward_s, backward_s, timeout, split)):
            best = min(rows[i], new, key=lambda r: r["measured"])
            rows[i] = best | {"attempts": rows[i]["attempts"] + 1}
    return rows


def _cases(schedules, ps, ms, v) -> list[tuple]:
    cases = []
    for name in schedules:
        for p in ps:
            for m in ms:
                chunks = v if name == "interleaved" else 1
                try:
                    check_schedule(build_schedule(name, p, m, chunks), m, chunks)
                except ValueError:
                    if name == "interleaved":
                        continue                       # interleaving needs m a multiple of p
                    raise
                cases.append((name, p, m, chunks))
    return cases


def _measure_once(cases: list[tuple], forward_s: float, backward_s: float, timeout: float,
                  split: bool = False) -> list[dict]:
    world = max(p for _, p, _, _ in cases)
    got = on_ranks(_bubble_rank, world, cases, forward_s, backward_s, timeout, split, timeout=timeout,
                   run_timeout=20 * timeout)
    rows = []
    for i, (name, p, m, chunks) in enumerate(cases):
        bubble, step = bubble_of_events([got["events"][r][i] for r in range(p)])
        rows.append({"schedule": name, "p": p, "m": m, "v": chunks, "measured": bubble,
                     "theory": bubble_theory(p, m, chunks), "step_s": step, "idle_s": bubble * p * step,
                     "attempts": 1})
    return rows


def against_naive(schedules=("gpipe", "1f1b", "interleaved"), p: int = 2, ms=(1, 2, 4, 8, 16, 20), v: int = 2,
                  forward_s: float = 0.06, backward_s: float = 0.12, cut: float = 0.9, timeout: float = 60.0,
                  attempts: int = 2) -> dict:
    """The naive schedule and each of `schedules` at each m, on p ranks, for one batch whose
    stage work is forward_s + backward_s in every case (measured on sleeping stages; a case
    further than 10% from theory is measured again, keeping its smallest bubble). What
    `compare_with_naive` returns."""
    # the naive case last: the first case runs twice (a warm-up), and the naive one is the longest
    cases = [c for c in _cases(schedules, [p], sorted(set(ms)), v) if c != ("gpipe", p, 1, 1)] + [("gpipe", p, 1, 1)]
    rows = _measure_cases(cases, forward_s, backward_s, timeout, 0.1, attempts, True)
    return compare_with_naive(rows, schedules, p, v, cut)


def compare_with_naive(rows: list[dict], schedules, p: int, v: int, cut: float = 0.9) -> dict:
    """Rows of one p ("schedule", "m", "v", "measured" idle fraction, "idle_s"), GPipe at m = 1
    among them (the naive schedule), as {"naive": its row, "rows": the schedules' rows +
    "idle_vs_naive" (idle fraction over the naive one's) and "idle_time_vs_naive" (idle
    rank-seconds over the naive's), "threshold": {schedule: {"measured": the fewest measured m
    whose idle fraction is at most (1 - cut) of the naive one (None if none is), "predicted": the
    formula's, "time_measured" / "time_predicted": the same for the idle rank-seconds, which fall
    as 1 / (v m) (each micro-batch is 1/m of the batch), "v"}}, "cut"}."""
    naive = next(r for r in rows if r["schedule"] == "gpipe" and r["m"] == 1) | {"schedule": "naive"}
    ours = [r | {"idle_vs_naive": r["measured"] / naive["measured"], "idle_time_vs_naive": r["idle_s"] / naive["idle_s"]}
            for r in rows if r["schedule"] in schedules]
    threshold = {}
    for name in schedules:
        chunks = v if name == "interleaved" else 1
        hits = [r["m"] for r in ours if r["schedule"] == name and r["idle_vs_naive"] <= (1 - cut) * (1 + 1e-9)]
        step = p if name == "interleaved" else 1
        time_hits = [r["m"] for r in ours if r["schedule"] == name and r["idle_time_vs_naive"] <= (1 - cut) * (1 + 1e-9)]
        threshold[name] = {"measured": min(hits) if hits else None, "v": chunks,
                           "predicted": micro_batches_for_idle_cut(p, chunks, cut, step),
                           "time_measured": min(time_hits) if time_hits else None,
                           "time_predicted": step * math.ceil(1 / ((1 - cut) * chunks * step) - 1e-9)}
    return {"naive": naive, "rows": ours, "threshold": threshold, "cut": cut}
