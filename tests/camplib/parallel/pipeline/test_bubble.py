"""camplib.parallel.pipeline.bubble: the bubble of the course's pipeline measured on real gloo
ranks (its own `pipeline_step`, sends and receives) with uniform stage compute (sleeping stages),
within 10% of (p-1)/(m+p-1) for GPipe and 1F1B, p in {2, 4}, m in {1, 2, 4, 8}.

Tolerance: 10% of the theory, relative (the issue's claim). The error is the receive's wake-up on
the critical path (a few ms per message on a loaded machine, ~0.1 ms on a quiet one); the sleeps
keep it small next to a stage's time. With 30 / 60 ms stages it reached 9.97% at load 5-7 and
12-23% for m = 8 at load 6 (a full-suite run with other work beside it); with 80 / 160 ms the
latency's share is under half that. A case further than 10% is measured again (up to 3 times, the
smallest bubble kept): an overloaded moment only ever adds idle time.
"""
import pytest

from camplib.parallel.pipeline.bubble import against_naive, bubble_of_events, compare_with_naive, measure_bubbles
from camplib.parallel.pipeline.schedule import bubble_theory, build_schedule, simulate


@pytest.mark.parametrize("name, p, m", [("gpipe", 4, 3), ("1f1b", 2, 5), ("1f1b", 4, 8)])
def test_the_measured_definition_equals_the_simulators_bubble(name, p, m):
    """bubble_of_events applied to the simulator's timeline gives the simulator's bubble: the
    measurement and the theory use one definition (idle / (p * step time))."""
    sim = simulate(build_schedule(name, p, m))
    bubble, step = bubble_of_events(sim["events"])
    assert bubble == pytest.approx(sim["bubble"], abs=1e-12), (name, p, m)
    assert step == pytest.approx(sim["makespan"], abs=1e-12)


@pytest.mark.slow   # ~22 s of sleeping stages (little CPU), plus a launch
def test_measured_bubble_is_within_10_percent_of_theory_for_gpipe_and_1f1b():
    rows = measure_bubbles(("gpipe", "1f1b"), ps=(2, 4), ms=(1, 2, 4, 8), forward_s=0.08, backward_s=0.16,
                           retry_above=0.10, attempts=3)
    assert len(rows) == 16
    bad = [r for r in rows if abs(r["measured"] - r["theory"]) > 0.10 * r["theory"]]
    table = "\n".join(f"{r['schedule']} p={r['p']} m={r['m']}: measured {r['measured']:.4f}, theory "
                      f"{r['theory']:.4f} ({abs(r['measured'] - r['theory']) / r['theory']:.1%} off, "
                      f"{r['attempts']} attempt(s))" for r in rows)
    assert not bad, f"bubble more than 10% from (p-1)/(m+p-1):\n{table}"


def _simulated_rows(p, ms, v):
    """Rows as measure_bubbles gives them, from the simulator's timelines (split: the batch's
    forward 1 and backward 2 cut over the m micro-batches, so every case does the same work)."""
    rows = []
    for name in ("gpipe", "1f1b", "interleaved"):
        chunks = v if name == "interleaved" else 1
        for m in ms:
            if name == "interleaved" and m % p:
                continue
            sim = simulate(build_schedule(name, p, m, chunks), v=chunks, forward_cost=1 / m, backward_cost=2 / m)
            rows.append({"schedule": name, "p": p, "m": m, "v": chunks, "measured": sim["bubble"],
                         "theory": bubble_theory(p, m, chunks), "step_s": sim["makespan"],
                         "idle_s": p * sim["makespan"] - sum(sim["busy"])})
    return rows


@pytest.mark.parametrize("p", [2, 3, 4])
def test_against_naive_on_the_simulators_timelines_finds_the_predicted_micro_batch_count(p):
    """On ideal timelines (the simulator's), the fewest m whose idle fraction is <= 10% of the
    naive schedule's is the formula's, for every schedule; and idle time falls as 1/(v m)."""
    v = 2
    result = compare_with_naive(_simulated_rows(p, range(1, 12 * p), v), ("gpipe", "1f1b", "interleaved"), p, v)
    assert result["naive"]["measured"] == pytest.approx((p - 1) / p)
    for name, t in result["threshold"].items():
        assert t["measured"] == t["predicted"], f"{name} p={p}: simulated {t['measured']}, formula {t['predicted']}"
        assert t["time_measured"] == t["time_predicted"], f"{name} p={p}: idle time, simulated {t['time_measured']}, " \
                                                          f"formula {t['time_predicted']}"
    for r in result["rows"]:
        assert r["idle_time_vs_naive"] == pytest.approx(1 / (r["v"] * r["m"])), r


@pytest.mark.slow   # ~12 s of sleeping stages on 2 ranks, plus a launch
def test_measured_idle_against_naive_follows_theory():
    """Measured on ranks, the same batch naive and cut into 2 or 4 micro-batches: the idle
    fraction over the naive one's within 15% of the theory's ratio (the tolerance above, plus
    the naive run's own error)."""
    result = against_naive(("1f1b", "interleaved"), p=2, ms=(2, 4), v=2, forward_s=0.32, backward_s=0.64, attempts=3)
    assert result["naive"]["measured"] == pytest.approx(0.5, rel=0.1)
    for r in result["rows"]:
        expected = r["theory"] / 0.5
        assert r["idle_vs_naive"] == pytest.approx(expected, rel=0.15), \
            f"{r['schedule']} m={r['m']}: idle {r['idle_vs_naive']:.3f} of the naive one's, theory {expected:.3f}"
