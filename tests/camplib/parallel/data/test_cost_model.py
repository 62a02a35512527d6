"""camplib.parallel.data.cost_model: the alpha-beta formulas (Thakur et al. 2005), the bytes per value
they assume equal to what camplib's compressed ring sends (counted on the collectives), a fit
that recovers alpha and beta, and the ring/tree crossover."""
import math

import pytest

from camplib.parallel.data.cost_model import (
    LINKS,
    all_reduce_time,
    bytes_per_value,
    fit_alpha_beta,
    predict_scaling,
    scaling_efficiency,
    step_time,
)
from camplib.parallel.data.scaling_run import time_all_reduces


def test_ring_and_tree_formulas():
    a, b, s = 3e-6, 1e-10, 1e8
    assert all_reduce_time(s, 1, a, b) == 0.0
    assert math.isclose(all_reduce_time(s, 8, a, b), 2 * 7 * a + 2 * 7 / 8 * s * b, rel_tol=1e-12)
    assert math.isclose(all_reduce_time(s, 8, a, b, "tree"), 2 * 3 * (a + s * b), rel_tol=1e-12)
    assert math.isclose(all_reduce_time(s, 5, a, b, "tree"), 2 * 3 * (a + s * b), rel_tol=1e-12)   # ceil(log2 5)
    # the codec is paid on each of the ring's 2(N-1) hops on S/N values
    assert math.isclose(all_reduce_time(s, 4, a, b, "ring", 1e-9, 1000), 6 * (a + s / 4 * b + 1e-9 * 250), rel_tol=1e-12)
    with pytest.raises(ValueError, match="algorithm"):
        all_reduce_time(s, 4, a, b, "butterfly")
    with pytest.raises(ValueError, match="n must be"):
        all_reduce_time(s, 0, a, b)


def test_tree_wins_small_messages_on_many_ranks_ring_wins_large_ones():
    link = LINKS["ib-ndr400"]
    assert all_reduce_time(1e3, 1024, link.alpha, link.beta, "tree") < all_reduce_time(1e3, 1024, link.alpha, link.beta)
    assert all_reduce_time(1e9, 1024, link.alpha, link.beta, "ring") < all_reduce_time(1e9, 1024, link.alpha, link.beta, "tree")


def test_step_time_overlap_and_efficiency():
    assert step_time(1.0, 0.5, overlap=True, backward_fraction=2 / 3) == 1.0          # fully hidden
    assert math.isclose(step_time(1.0, 1.0, overlap=True, backward_fraction=0.5), 1.5)
    assert step_time(1.0, 0.5, overlap=False) == 1.5
    assert scaling_efficiency(1e9, 1, 0.3, 5e-6, 1 / 50e9) == 1.0
    fp32 = scaling_efficiency(1e9, 64, 0.3, 5e-6, 1 / 50e9, "none", overlap=False)
    int8 = scaling_efficiency(1e9, 64, 0.3, 5e-6, 1 / 50e9, "int8", overlap=False)
    comm = 2 * 63 * (5e-6 + 4e9 / 64 / 50e9)
    assert math.isclose(fp32, 0.3 / (0.3 + comm), rel_tol=1e-12) and int8 > fp32
    rows = predict_scaling(1e9, 0.3, LINKS["ib-ndr400"], (2, 1024), overlap=False)
    assert [r["n"] for r in rows] == [2, 1024] and rows[1]["none"] < rows[0]["none"]


def test_fit_recovers_alpha_and_beta():
    alpha, beta = 40e-6, 2e-9
    samples = [(n, s, all_reduce_time(s, n, alpha, beta)) for n in (2, 4, 8) for s in (1e3, 1e5, 1e7)]
    got = fit_alpha_beta(samples)
    assert math.isclose(got.alpha, alpha, rel_tol=1e-9) and math.isclose(got.beta, beta, rel_tol=1e-9)
    with pytest.raises(ValueError):
        fit_alpha_beta([(1, 1e3, 1.0), (2, 1e3, 1.0)])


def test_bytes_per_value_is_what_the_compressed_ring_sends():
    """Counted on the collectives on 3 gloo ranks: each rank sends 2(N-1)/N * Ψ * bytes per
    value (int8: blocks of 256 and one fp32 scale each; Ψ a multiple of N * 256, no padding). 3.5-8 s
    (load 5-20)."""
    numel = 3 * 2 * 256 * 4
    for n in (3,):
        got = time_all_reduces(n, (numel,), ("none", "fp16", "int8"), repeats=1)["bytes_per_call"]
        for method in ("none", "fp16", "int8"):
            assert got[f"{method}/{numel}"] == 2 * (n - 1) / n * numel * bytes_per_value(method), (n, method, got)


def test_timed_steps_report_compute_step_and_the_bytes_of_the_ring():
    """time_steps on 2 ranks: an MLP step sends the ring's
    2(N-1)/N * Ψ * bytes per value (padded to whole int8 blocks per rank) and takes longer than its
    compute alone. ~2 s."""
    from camplib.parallel.data.scaling_run import time_steps
    got = time_steps(2, [16, 16], batch=8, methods=("none", "int8"), repeats=2, block=16)
    psi = got["n_params"]
    assert psi == 16 * 16 + 16
    assert got["bytes_per_step"]["none"] == psi * 4                     # 2(N-1)/N = 1 for N = 2
    padded = -(-psi // (2 * 16)) * 2 * 16
    assert got["bytes_per_step"]["int8"] == padded * bytes_per_value("int8", 16)
    assert 0 < got["compute_s"] < got["step_s"]["none"], got
