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

from camplib.parallel.pipeline.bubble import bubble_of_events, measure_bubbles
from camplib.parallel.pipeline.schedule import build_schedule, simulate


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
