"""camplib.parallel.planner: parameters per rank and bytes per step equal what hybrid training
measures on gloo ranks (exactly: both are counts), ring attention's sends equal the formula, and
`plan` lists exactly the layouts that divide the model and fit in memory."""
import math

import pytest
import torch

from camplib.model import GPT, GPTConfig
from camplib.parallel.context.ring import ring_attention
from camplib.parallel.context.run import run_ring_attention
from camplib.parallel.hybrid.run import train_hybrid
from camplib.parallel.mesh import MeshShape
from camplib.parallel.planner import layout_cost, params_per_stage, plan
from camplib.parallel.reference import make_data

CONFIG = {"vocab_size": 30, "n_layer": 3, "n_head": 2, "d_model": 16, "max_seq_len": 8, "tie_embeddings": False}


@pytest.mark.parametrize("shape, m, tied", [(MeshShape(dp=2, pp=2), 2, False), (MeshShape(pp=3, tp=2), 1, False),
                                           (MeshShape(pp=2, cp=2), 2, True)],
                         ids=["dp2-pp2-m2", "pp3-tp2-m1", "pp2-cp2-m2-tied"])
def test_planned_bytes_equal_the_measured_ones(shape, m, tied):
    config = CONFIG | {"tie_embeddings": tied}
    spec = {"kind": "gpt", "config": config, "dtype": "float64", "seed": 0}
    data = make_data(spec, 1, 8, seed=1, seq_len=8)
    got = train_hybrid(spec, data, 1, shape, m=m, hyper={"lr": 1e-2}, timeout=30)
    cost = layout_cost(GPTConfig(**config), shape, 8, 8, m, param_bytes=8)
    for rank, c in enumerate(got["coords"]):
        row = cost["stages"][c["pp"]]
        measured = got["bytes_per_step"][rank]
        assert got["param_bytes"][rank] == row["params"] * 8, (rank, c, got["param_bytes"][rank], row["params"])
        assert measured.get("allreduce", 0) == row["tp_allreduce_payload"], (rank, c, measured, row)
        assert measured["send"] == row["send"], (rank, c, measured, row)


def test_one_rank_holds_the_whole_model():
    cfg = GPTConfig(**CONFIG)
    assert params_per_stage(cfg, 1, 1) == [sum(p.numel() for p in GPT(cfg).parameters())]


def test_ring_attention_sends_what_the_planner_says():
    cp, t = 4, 1
    q = torch.randn(1, 2, 16, 4, dtype=torch.float64)      # d_model 8 as 2 heads of 4
    measured = run_ring_attention(ring_attention, q, q, q, cp, q)["bytes_sent"]
    cfg = GPTConfig(**{**CONFIG, "d_model": 8, "n_layer": 1, "max_seq_len": 16})
    cost = layout_cost(cfg, MeshShape(cp=cp, tp=t), batch=1, seq_len=16, m=1, param_bytes=8)
    assert measured == [cost["stages"][0]["cp_send"]] * cp


def test_plan_lists_exactly_the_layouts_that_divide_and_fit():
    cfg = GPTConfig.gpt2_style(n_layer=4, d_model=64, n_head=4, vocab_size=100, max_seq_len=32)
    every = plan(cfg, 8, math.inf, batch=16, seq_len=32, m=2)
    layouts = {(c["shape"].dp, c["shape"].pp, c["shape"].cp, c["shape"].tp) for c in every}
    assert all(math.prod(x) == 8 for x in layouts) and (2, 2, 1, 2) in layouts and (1, 1, 1, 8) not in layouts
    totals = [c["memory"]["total"] for c in every]
    assert totals == sorted(totals)
    budget = totals[len(totals) // 2]
    assert [c["layout"] for c in plan(cfg, 8, budget, 16, 32, 2)] == [c["layout"] for c in every if c["memory"]["total"] <= budget]
    assert plan(cfg, 8, 1, 16, 32, 2) == []
