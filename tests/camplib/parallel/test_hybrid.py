"""camplib.parallel.hybrid: camplib's GPT trained on DP x PP x TP gloo ranks (ZeRO-1 over dp,
1F1B over pp, Megatron layers over tp) follows the loss curve of one process training the dense
model on the whole batch with torch's AdamW, and ends with the same parameters.

Tolerances (fp64): losses atol 1e-12, parameters after 3 AdamW steps atol 1e-10 (the ranks sum
partial matmuls and gradients in other orders; measured 3e-13).
"""
import pytest
import torch

from camplib.model import GPTConfig
from camplib.parallel.hybrid import check_hybrid
from camplib.parallel.hybrid_run import train_hybrid
from camplib.parallel.mesh import MeshShape
from camplib.parallel.reference import make_data, reference_run
from tests.support import assert_close

CONFIG = {"vocab_size": 32, "n_layer": 2, "n_head": 2, "d_model": 16, "max_seq_len": 8, "tie_embeddings": False}
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




@pytest.mark.parametrize("shape, cfg, batch, m, words", [
    (MeshShape(dp=3, pp=2, tp=2), CONFIG, 8, 1, "needs 12 ranks"),
    (MeshShape(tp=4, pp=2), CONFIG, 8, 1, "n_head=2 is not divisible by tp=4"),
    (MeshShape(pp=4, dp=2), CONFIG, 8, 1, "pp=4 stages but only n_layer=2"),
    (MeshShape(cp=2, pp=2, dp=2), CONFIG, 8, 1, "context parallelism is not wired"),
    (MeshShape(dp=2, pp=2, tp=2), CONFIG | {"tie_embeddings": True}, 8, 1, "tie_embeddings=True"),
    (MeshShape(dp=2, pp=2, tp=2), CONFIG, 8, 3, "do not split into m=3"),
])
def test_bad_layouts_are_refused_before_any_rank_starts(shape, cfg, batch, m, words):
    with pytest.raises(ValueError, match=words):
        check_hybrid(shape, 8 if "needs" in words else shape.world_size, GPTConfig(**cfg), batch, 8, m)


@pytest.mark.slow   # two fresh Python processes importing torch: 10-35 s on 2 shared cores
def test_the_same_script_runs_under_torchrun(tmp_path):
    """`torchrun --standalone --nproc_per_node 2 -m camplib.parallel.hybrid_run --dp 2`: launch
    uses torchrun's ranks instead of forking, and the losses equal one process's."""
    import json
    import subprocess
    import sys
    from camplib.parallel.hybrid_run import DEMO_HYPER, demo_setup
    out = tmp_path / "losses.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "camplib.parallel.hybrid_run", "--dp", "2", "--steps", "2", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["layout"] == "pp=1 x dp=2 x cp=1 x tp=1"
    spec, data, _ = demo_setup(dp=2, steps=2)
    expected = reference_run(spec, data, 2, "adamw", DEMO_HYPER)["losses"]
    assert_close("losses under torchrun vs one process", torch.tensor(got["losses"]), torch.tensor(expected),
                 atol=1e-12, rtol=0)
