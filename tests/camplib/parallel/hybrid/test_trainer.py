"""camplib.parallel.hybrid.trainer: camplib's GPT trained on DP x PP x CP x TP gloo ranks (ZeRO-1 over
dp x cp, 1F1B over pp, ring attention over cp, Megatron layers over tp, optionally with sequence
parallelism, a tied embedding summed between the first and last stage) follows the loss curve of
one process training the dense model on the whole batch with torch's AdamW, and ends with the
same parameters.

Tolerances: fp64 losses atol 1e-12, parameters after 3 AdamW steps atol 1e-10 (the ranks sum
partial matmuls and gradients in other orders; measured 3e-13 at most). fp32: losses atol 2e-6
(measured 3e-7), parameters atol 1e-4 (measured 9e-6: AdamW's first steps divide by sqrt(v),
which magnifies rounding in gradients near zero).
"""
import pytest
import torch

from camplib.model import GPTConfig
from camplib.parallel.hybrid.trainer import check_hybrid
from camplib.parallel.hybrid.run import choose_backend, train_hybrid
from camplib.parallel.mesh import MeshShape
from camplib.parallel.planner import layout_cost
from camplib.parallel.reference import make_data, reference_run
from tests.support import assert_close

CONFIG = {"vocab_size": 32, "n_layer": 2, "n_head": 2, "d_model": 16, "max_seq_len": 8, "tie_embeddings": False}
LLAMA = CONFIG | {"n_kv_head": 2, "norm": "rmsnorm", "mlp": "swiglu", "pos": "rope", "bias": False}
TOL = {"float64": (1e-12, 1e-10), "float32": (2e-6, 1e-4)}   # (losses, parameters after STEPS steps)
SPEC = {"kind": "gpt", "config": CONFIG, "dtype": "float64", "seed": 0}
HYPER = {"lr": 1e-2, "weight_decay": 0.01}
STEPS = 3


@pytest.fixture(scope="module")
def reference():
    data = make_data(SPEC, STEPS, 8, seed=1, seq_len=8)
    return data, reference_run(SPEC, data, STEPS, "adamw", HYPER)


def test_hybrid_training_on_2x2x2_equals_one_process(reference):
    """(dp=4 x pp=2 is checked against one process by the checkpoint test's second leg.)"""
    data, expected = reference
    shape = MeshShape(dp=2, pp=2, tp=2)
    got = train_hybrid(SPEC, data, STEPS, shape, m=2, hyper=HYPER, timeout=30)
    assert_close(f"loss curve on {shape.describe()}", torch.tensor(got["losses"]),
                 torch.tensor(expected["losses"]), atol=1e-12, rtol=0)
    assert_close(f"parameters after {STEPS} steps on {shape.describe()}", got["params"], expected["params"],
                 atol=1e-10, rtol=0)
    # pp=2 halves the blocks and tp=2 the big weights: every rank holds under half the dense
    # model's bytes (norms and biases are replicated over tp), and the dp replicas the same
    full = sum(p.numel() * p.element_size() for p in got["params"].values())
    held = got["param_bytes"]
    assert max(held) < full / 2, (held, full)
    for rank, c in enumerate(got["coords"]):
        assert held[rank] == held[shape.rank_of(pp=c["pp"], tp=c["tp"], dp=1 - c["dp"])], (rank, held)




def _train_and_compare(shape, cfg, dtype, sp, m=2, zero_stage=1):
    spec = {"kind": "gpt", "config": cfg, "dtype": dtype, "seed": 0}
    data = make_data(spec, STEPS, 8, seed=1, seq_len=8)
    expected = reference_run(spec, data, STEPS, "adamw", HYPER)
    got = train_hybrid(spec, data, STEPS, shape, m=m, hyper=HYPER, timeout=30, sequence_parallel=sp,
                       zero_stage=zero_stage)
    case = (f"{shape.describe()}{' +SP' if sp else ''}, pos={cfg.get('pos', 'learned')}, tied={cfg['tie_embeddings']}, "
            f"{dtype}, ZeRO-{zero_stage}")
    loss_tol, param_tol = TOL[dtype]
    assert_close(f"loss curve on {case}", torch.tensor(got["losses"]), torch.tensor(expected["losses"]),
                 atol=loss_tol, rtol=0)
    assert_close(f"parameters after {STEPS} steps on {case}", got["params"], expected["params"], atol=param_tol, rtol=0)
    return got


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_zero2_and_zero3_with_tensor_and_pipeline_parallelism_equal_one_process_and_hold_what_the_planner_says(
        zero_stage):
    """dp=2 x pp=2 x tp=2 with sequence parallelism and the embedding tied across the stages,
    ZeRO-2 (gradient shards, reduce-scattered per micro-batch from hooks) and ZeRO-3 (parameter
    shards too, gathered around each block's use): the losses and parameters of one process, and
    per rank the parameter, gradient and AdamW-state bytes of `planner.layout_cost(zero_stage=)`
    up to the flat units' padding (each unit padded to a multiple of dp*cp: < units * dp*cp
    elements). ~3 s each."""
    shape, cfg = MeshShape(dp=2, pp=2, tp=2), CONFIG | {"tie_embeddings": True}
    got = _train_and_compare(shape, cfg, "float64", sp=True, zero_stage=zero_stage)
    cost = layout_cost(GPTConfig(**cfg), shape, 8, 8, 2, param_bytes=8, zero_stage=zero_stage)
    slack = 8 * 8 * shape.dp * shape.cp      # 8 bytes x (at most 8 units per stage here) x dp*cp
    for rank, c in enumerate(got["coords"]):
        planned, held = cost["stages"][c["pp"]]["memory"], got["memory"][rank]
        for key in ("params", "grads", "optimizer"):
            assert 0 <= held[key] - planned[key] < slack, (rank, c, key, held, planned)
        assert held["activations"] > 0, held
    one = {k: got["memory"][0][k] for k in ("params", "grads")}
    full = cost["stages"][0]["params"] * 8
    assert one["grads"] < full and (one["params"] < full) == (zero_stage == 3), (one, full)


@pytest.mark.slow   # 8 gloo ranks, Llama-style: ~3 s
def test_zero3_with_context_and_pipeline_parallelism_equals_one_process():
    _train_and_compare(MeshShape(dp=2, pp=2, cp=2), LLAMA | {"tie_embeddings": True}, "float64", sp=False, zero_stage=3)


def test_4d_training_pp2_cp2_tp2_with_sequence_parallelism_and_tied_embeddings_equals_one_process():
    """1x2x2x2 on 8 ranks, Llama-style (RoPE on the zig-zag chunks' positions, RMSNorm on
    sequence shards, SwiGLU, GQA heads split over tp), the token embedding tied to the LM head
    across the two stages. (dp x cp with ZeRO over both: the 4-rank cases below; 2x2x2x2 on 16
    ranks, run once by hand: fp64 loss 4e-16, parameters 6e-15; fp32 1e-7, 8e-7.)"""
    _train_and_compare(MeshShape(pp=2, cp=2, tp=2), LLAMA | {"tie_embeddings": True}, "float64", sp=True)


@pytest.mark.parametrize("shape, cfg, dtype, sp", [
    (MeshShape(dp=2, cp=2), CONFIG, "float32", False),                                  # learned positions
    (MeshShape(pp=2, tp=2), CONFIG | {"tie_embeddings": True}, "float64", True),       # SP + tied, no cp
    (MeshShape(pp=2, cp=2), LLAMA | {"tie_embeddings": True}, "float64", False),
    (MeshShape(dp=2, pp=2), CONFIG | {"tie_embeddings": True}, "float32", False),       # tied + ZeRO over dp
], ids=["dp2-cp2-fp32", "pp2-tp2-sp-tied", "pp2-cp2-rope-tied", "dp2-pp2-tied-fp32"])
def test_context_sequence_parallel_and_tied_layouts_on_4_ranks_equal_one_process(shape, cfg, dtype, sp):
    _train_and_compare(shape, cfg, dtype, sp)


@pytest.mark.parametrize("shape, cfg, batch, m, seq, sp, words", [
    (MeshShape(dp=3, pp=2, tp=2), CONFIG, 8, 1, 8, False, "needs 12 ranks"),
    (MeshShape(tp=4, pp=2), CONFIG, 8, 1, 8, False, "n_head=2 is not divisible by tp=4"),
    (MeshShape(pp=4, dp=2), CONFIG, 8, 1, 8, False, "pp=4 stages but only n_layer=2"),
    (MeshShape(dp=2, pp=2, tp=2), CONFIG, 8, 3, 8, False, "do not split into m=3"),
    (MeshShape(cp=2, pp=2, dp=2), CONFIG, 8, 1, 6, False, r"seq_len=6 is not divisible by 2\*cp=4"),
    (MeshShape(cp=2, tp=4), CONFIG | {"n_head": 4}, 8, 1, 12, True, r"seq_len=12 is not divisible by cp\*tp=8"),
    (MeshShape(cp=2, dp=2), CONFIG | {"dropout": 0.1}, 8, 1, 8, False, "ring attention has no dropout"),
])
def test_bad_layouts_are_refused_before_any_rank_starts(shape, cfg, batch, m, seq, sp, words):
    with pytest.raises(ValueError, match=words):
        check_hybrid(shape, 8 if "needs" in words else shape.world_size, GPTConfig(**cfg), batch, seq, m, sp)


@pytest.mark.parametrize("world, cuda, nccl, local, expected", [
    (8, 8, True, None, "nccl"), (8, 4, True, None, "gloo"), (8, 8, False, None, "gloo"), (8, 0, True, None, "gloo"),
    (16, 8, True, 8, "nccl"),    # torchrun on two machines: 8 local ranks, 8 GPUs each
])
def test_backend_is_nccl_only_with_a_gpu_for_every_local_rank(world, cuda, nccl, local, expected):
    assert choose_backend(world, cuda_devices=cuda, nccl=nccl, local_world_size=local) == expected


@pytest.mark.slow   # two fresh Python processes importing torch: 10-35 s on 2 shared cores
def test_the_same_script_runs_under_torchrun(tmp_path):
    """`torchrun --standalone --nproc_per_node 2 -m camplib.parallel.hybrid.run --dp 2`: launch
    uses torchrun's ranks instead of forking, and the losses equal one process's."""
    import json
    import subprocess
    import sys
    from camplib.parallel.hybrid.run import DEMO_HYPER, demo_setup
    out = tmp_path / "losses.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "camplib.parallel.hybrid.run", "--dp", "2", "--steps", "2", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["layout"] == "pp=1 x dp=2 x cp=1 x tp=1"
    spec, data, _ = demo_setup(dp=2, steps=2)
    expected = reference_run(spec, data, 2, "adamw", DEMO_HYPER)["losses"]
    assert_close("losses under torchrun vs one process", torch.tensor(got["losses"]), torch.tensor(expected),
                 atol=1e-12, rtol=0)
