"""Pipeline schedules: runnable (each forward before its backward, no deadlock), the bubble of
the theory, and the activations in flight (GPipe m, 1F1B at most p)."""
import pytest

from camplib.parallel.pipeline.schedule import (Action, build_schedule, bubble_theory, check_schedule, gpipe,
                                                interleaved_1f1b, one_f_one_b, simulate)

GRID = [(p, m) for p in (1, 2, 3, 4) for m in (1, 2, 3, 4, 8)]


@pytest.mark.parametrize("p,m", GRID)
def test_gpipe_and_1f1b_run_and_match_the_theory(p, m):
    for name, sched in (("gpipe", gpipe(p, m)), ("1f1b", one_f_one_b(p, m))):
        check_schedule(sched, m)
        sim = simulate(sched)
        assert sim["bubble"] == pytest.approx(bubble_theory(p, m), abs=1e-12), (name, p, m, sim["bubble"])
        peak = sim["peak_in_flight"]
        if name == "gpipe":
            assert peak == [m] * p, (p, m, peak)
        else:
            assert peak == [min(p - r, m) for r in range(p)], (p, m, peak)
            assert max(peak) <= p


@pytest.mark.parametrize("p,m,v", [(p, m, v) for p in (1, 2, 4) for v in (2, 3) for m in (p, 2 * p, 4 * p)])
def test_interleaved_runs_with_a_v_times_smaller_bubble(p, m, v):
    sched = interleaved_1f1b(p, m, v)
    check_schedule(sched, m, v)
    sim = simulate(sched, v=v)
    assert sim["bubble"] == pytest.approx(bubble_theory(p, m, v), abs=1e-12), (p, m, v, sim["bubble"])


def test_1f1b_warms_up_with_p_minus_rank_minus_1_forwards():
    sched = one_f_one_b(4, 8)
    for r, actions in enumerate(sched):
        first_backward = next(i for i, a in enumerate(actions) if a.kind == "B")
        assert first_backward == 4 - r, (r, actions)   # p - r - 1 warm-up forwards + one steady forward


def test_check_schedule_names_a_backward_before_its_forward():
    bad = [[Action("B", 0), Action("F", 0)]]
    with pytest.raises(ValueError, match=r"rank 0 runs B0 \(a backward\) before its forward F0"):
        check_schedule(bad, 1)


def test_check_schedule_finds_a_deadlock():
    # rank 1 (last stage) wants B0 first; its F0 comes after: fine for order, but rank 0 waits
    # for B0's gradient before sending F1, and rank 1 needs F1 before anything else
    bad = [[Action("F", 0), Action("B", 0), Action("F", 1), Action("B", 1)],
           [Action("F", 1), Action("F", 0), Action("B", 0), Action("B", 1)]]
    with pytest.raises(ValueError, match="deadlocks"):
        check_schedule(bad, 2)


def test_check_schedule_names_missing_actions():
    with pytest.raises(ValueError, match=r"rank 1 runs 2 actions, expected 4"):
        check_schedule([gpipe(2, 2)[0], [Action("F", 0), Action("B", 0)]], 2)


@pytest.mark.parametrize("args,message", [
    (("interleaved", 2, 3, 2), "m=3 to be a multiple of the ranks p=2"),
    (("1f1b", 2, 4, 2), "use 'interleaved'"),
    (("zigzag", 2, 4), "unknown schedule"),
    (("gpipe", 0, 4), "p \\(ranks\\) must be a positive integer"),
])
def test_bad_sizes_raise_clear_errors(args, message):
    with pytest.raises(ValueError, match=message):
        build_schedule(*args)


def test_plain_tuples_are_actions_and_junk_is_named():
    tuples = [[("F", 0), ("B", 0)], [("F", 0), ("B", 0)]]
    assert simulate(tuples)["bubble"] == pytest.approx(bubble_theory(2, 1))
    with pytest.raises(ValueError, match=r"rank 1: \('X', 0\) is not an action"):
        check_schedule([[("F", 0), ("B", 0)], [("X", 0)]], 1)
