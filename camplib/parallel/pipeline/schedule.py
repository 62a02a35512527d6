"""Pipeline schedules as explicit per-rank action lists, and a simulator that times them.

A schedule for p ranks is `[actions of rank 0, ..., actions of rank p-1]`; each action is
`Action("F" | "B", micro_batch, chunk)`: the forward or the backward of one micro-batch through
one of the rank's model chunks. With v chunks per rank (interleaved), chunk c of rank r is the
global stage s = c * p + r, so a micro-batch visits rank 0, 1, ..., p-1, then rank 0 again.

- `gpipe(p, m)` (Huang et al. 2019): every forward, then every backward. Every rank holds the
  activations of all m micro-batches at once.
- `one_f_one_b(p, m)` (PipeDream-Flush, Narayanan et al. 2021; Megatron): rank r warms up with
  min(p - r - 1, m) forwards, then alternates one forward, one backward, then drains the
  backwards. Same bubble as GPipe, but at most p - r micro-batches in flight.
- `interleaved_1f1b(p, m, v)` (Megatron, Narayanan et al. 2021): the same with v chunks per rank
  visited in groups of p micro-batches; the bubble shrinks v times, (p-1)/(v*m + p-1).

`check_schedule` proves a schedule runnable (every forward before its backward, every
micro-batch exactly once through every stage, and no deadlock when each rank runs its list in
order and waits for the messages it needs); `simulate` times it with given forward/backward costs
and gives the bubble fraction and the peak number of micro-batches each rank holds in flight.
Pure Python: no torch, so a schedule can be drawn and checked without any rank.
"""
from __future__ import annotations

from typing import NamedTuple

__all__ = ["Action", "SCHEDULES", "as_actions", "bubble_theory", "build_schedule", "check_schedule", "gpipe",
           "interleaved_1f1b", "micro_batches_for_idle_cut", "one_f_one_b", "peak_in_flight", "simulate", "stage_of"]


class Action(NamedTuple):
    kind: str        # "F" forward, "B" backward
    mb: int          # micro-batch
    chunk: int = 0   # which of the rank's v model chunks (virtual stage); 0 without interleaving

    def __repr__(self) -> str:
        return f"{self.kind}{self.mb}" + (f".{self.chunk}" if self.chunk else "")


def _check_sizes(p: int, m: int, v: int = 1) -> None:
    for name, value in (("p (ranks)", p), ("m (micro-batches)", m), ("v (chunks per rank)", v)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def as_actions(schedule) -> list[list[Action]]:
    """A schedule written with plain tuples ("F", mb) / ("B", mb, chunk) as Actions; a clear
    ValueError for anything else."""
    if not isinstance(schedule, (list, tuple)):
        raise ValueError(f"a schedule is a list of per-rank action lists, got {type(schedule).__name__}")
    out = []
    for r, actions in enumerate(schedule):
        row = []
        for a in actions:
            if not (isinstance(a, (tuple, list)) and 2 <= len(a) <= 3 and a[0] in ("F", "B")
                    and all(isinstance(x, int) and x >= 0 for x in a[1:])):
                raise ValueError(f"rank {r}: {a!r} is not an action (\"F\" or \"B\", micro-batch[, chunk])")
            row.append(Action(*a))
        out.append(row)
    return out


def stage_of(rank: int, chunk: int, p: int) -> int:
    """The global stage of `chunk` on `rank`: chunks are dealt round-robin over the ranks."""
    return chunk * p + rank


def gpipe(p: int, m: int) -> list[list[Action]]:
    """All m forwards, then all m backwards, on every rank."""
    _check_sizes(p, m)
    return [[Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)] for _ in range(p)]


def one_f_one_b(p: int, m: int) -> list[list[Action]]:
    """Rank r: min(p - r - 1, m) warm-up forwards, then (forward, backward) pairs, then the
    remaining backwards. The last rank starts each backward right after its forward."""
    _check_sizes(p, m)
    schedule = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        actions = [Action("F", i) for i in range(warmup)]
        for i in range(m - warmup):
            actions += [Action("F", warmup + i), Action("B", i)]
        actions += [Action("B", i) for i in range(m - warmup, m)]
        schedule.append(actions)
    return schedule


def interleaved_1f1b(p: int, m: int, v: int) -> list[list[Action]]:
    """Megatron's interleaved 1F1B: forwards go through the chunks in groups of p micro-batches
    (mb 0..p-1 on chunk 0, then on chunk 1, ...), backwards likewise from the last chunk; rank r
    warms up with 2 (p - r - 1) + (v - 1) p forwards (all of them when m == p). m must be a
    multiple of p, as in Megatron: otherwise the groups do not tile."""
    _check_sizes(p, m, v)
    if v == 1:
        return one_f_one_b(p, m)
    if m % p:
        raise ValueError(f"interleaved 1F1B needs the micro-batches m={m} to be a multiple of the ranks p={p}")
    total = m * v

    def forward(k: int) -> Action:
        return Action("F", (k // (p * v)) * p + k % p, (k // p) % v)

    def backward(k: int) -> Action:
        return Action("B", (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)

    schedule = []
    for r in range(p):
        warmup = total if m == p else min(2 * (p - r - 1) + (v - 1) * p, total)
        actions = [forward(k) for k in range(warmup)]
        for k in range(total - warmup):
            actions += [forward(warmup + k), backward(k)]
        actions += [backward(k) for k in range(total - warmup, total)]
        schedule.append(actions)
    return schedule


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved_1f1b}


def build_schedule(name: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """SCHEDULES[name] for (p, m[, v]); v > 1 only for "interleaved"."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}, expected one of {sorted(SCHEDULES)}")
    if name != "interleaved" and v != 1:
        raise ValueError(f"schedule {name!r} has one chunk per rank, got v={v} (use 'interleaved')")
    return interleaved_1f1b(p, m, v) if name == "interleaved" else SCHEDULES[name](p, m)


def bubble_theory(p: int, m: int, v: int = 1) -> float:
    """The idle fraction of a flushed pipeline with uniform stages: (p-1) / (v*m + p-1)."""
    return (p - 1) / (v * m + p - 1)


def micro_batches_for_idle_cut(p: int, v: int = 1, cut: float = 0.9, multiple_of: int = 1) -> int:
    """The fewest micro-batches m (a multiple of `multiple_of`: p for interleaved) whose bubble
    (p-1)/(v*m+p-1) is at most (1 - cut) times the naive schedule's, (p-1)/p: one batch, no
    micro-batches, one rank working at a time (GPipe with m = 1). Solving the inequality gives
    v*m >= p/(1-cut) - p + 1, i.e. v*m >= 9p + 1 for a 90% cut."""
    if not 0 <= cut < 1:
        raise ValueError(f"cut must be in [0, 1), got {cut}")
    naive = bubble_theory(p, 1)
    m = multiple_of
    while bubble_theory(p, m, v) > (1 - cut) * naive * (1 + 1e-12):
        m += multiple_of
    return m


def peak_in_flight(actions: list[Action]) -> int:
    """The most (micro-batch, chunk) forwards a rank holds activations for at once."""
    held, peak = 0, 0
    for a in actions:
        held += 1 if a.kind == "F" else -1
        peak = max(peak, held)
    return peak


def check_schedule(schedule: list[list[Action]], m: int, v: int = 1) -> None:
    """Raise ValueError (naming the rank and the action) unless every rank runs F then B of every
    (micro-batch, chunk) exactly once, and the ranks, each running its list in order, never wait
    forever (see `simulate`)."""
    schedule = as_actions(schedule)
    p = len(schedule)
    expected = sorted((kind, i, c) for kind in "FB" for i in range(m) for c in range(v))
    for r, actions in enumerate(schedule):
        got = sorted((a.kind, a.mb, a.chunk) for a in actions)
        if got != expected:
            missing = sorted(set(expected) - set(got))[:4]
            extra = sorted(set(got) - set(expected))[:4]
            dup = len(got) - len(set(got))
            raise ValueError(f"rank {r} runs {len(got)} actions, expected {len(expected)} (F and B of each of "
                             f"m={m} micro-batches x v={v} chunks once): missing {missing}, unexpected {extra}, "
                             f"{dup} duplicated")
        done = set()
        for a in actions:
            if a.kind == "B" and ("F", a.mb, a.chunk) not in done:
                raise ValueError(f"rank {r} runs {a!r} (a backward) before its forward F{a.mb}"
                                 + (f".{a.chunk}" if a.chunk else ""))
            done.add((a.kind, a.mb, a.chunk))
    simulate(schedule, v=v)  # raises on a deadlock
    _ = p


def simulate(schedule: list[list[Action]], v: int = 1, forward_cost: float = 1.0,
             backward_cost: float = 2.0) -> dict:
    """Time a schedule: each rank runs its actions in order, one at a time; an action starts when
    the rank is free and its input exists (a forward: the previous stage's forward of that
    micro-batch; a backward: the next stage's backward, and its own forward). A chunk's forward
    costs forward_cost / v (a rank's v chunks together are one stage's work). Messages are free.

    Returns {"events": [per rank: [(action, start, end)]], "makespan", "busy" (per rank),
    "bubble" (idle / (p * makespan)), "peak_in_flight" (per rank)}. Raises ValueError naming
    the waiting actions if the ranks deadlock."""
    schedule = as_actions(schedule)
    p = len(schedule)
    n_stages = p * v
    tf, tb = forward_cost / v, backward_cost / v
    finished: dict[tuple[str, int, int], float] = {}   # (kind, mb, global stage) -> end time
    clock, cursor = [0.0] * p, [0] * p
    events: list[list[tuple[Action, float, float]]] = [[] for _ in range(p)]
    remaining = sum(len(a) for a in schedule)
    while remaining:
        progressed = False
        for r in range(p):
            while cursor[r] < len(schedule[r]):
                a = schedule[r][cursor[r]]
                s = stage_of(r, a.chunk, p)
                if a.kind == "F":
                    needs = [("F", a.mb, s - 1)] if s > 0 else []
                else:
                    needs = [("F", a.mb, s)] + ([("B", a.mb, s + 1)] if s < n_stages - 1 else [])
                if any(n not in finished for n in needs):
                    break
                start = max([clock[r]] + [finished[n] for n in needs])
                end = start + (tf if a.kind == "F" else tb)
                finished[(a.kind, a.mb, s)] = clock[r] = end
                events[r].append((a, start, end))
                cursor[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            waiting = {r: schedule[r][cursor[r]] for r in range(p) if cursor[r] < len(schedule[r])}
            raise ValueError(f"the schedule deadlocks: every rank waits for an input that is never produced; "
                             f"next actions per rank {waiting}")
    makespan = max(clock)
    busy = [sum(end - start for _, start, end in ev) for ev in events]
    return {"events": events, "makespan": makespan, "busy": busy,
            "bubble": 1.0 - sum(busy) / (p * makespan),
            "peak_in_flight": [peak_in_flight(a) for a in schedule]}
