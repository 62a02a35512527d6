"""camplib.parallel.dist_checkpoint: a checkpoint saved by DP x PP x TP ranks loads on another
layout (2x2x2 -> dp=4 pp=2 -> one process) and training continues with the losses of an
uninterrupted run; a rank killed mid-save leaves the previous checkpoint the one that loads; a
checkpoint of another model is refused with the differences named, before any rank starts.

Tolerances (fp64): losses atol 1e-12, parameters atol 1e-10 (measured 4e-16 and 1e-14).
"""
import pytest
import torch

from camplib.train_state import CheckpointError
from camplib.dist import RankDied
from camplib.parallel.dist_checkpoint import latest_step, load_dense
from camplib.parallel.hybrid.run import train_hybrid, train_single
from camplib.parallel.mesh import MeshShape
from camplib.parallel.reference import make_data, reference_run
from tests.support import assert_close

CONFIG = {"vocab_size": 32, "n_layer": 2, "n_head": 2, "d_model": 16, "max_seq_len": 8, "tie_embeddings": False}
SPEC = {"kind": "gpt", "config": CONFIG, "dtype": "float64", "seed": 0}
HYPER = {"lr": 1e-2, "weight_decay": 0.01}


@pytest.fixture(scope="module")
def data():
    return make_data(SPEC, 6, 8, seed=1, seq_len=8)


@pytest.mark.slow   # 8 + 8 gloo ranks and one process: 5-11 s on 2 shared cores
def test_reshard_2x2x2_to_dp4_pp2_to_one_process_continues_the_same_losses(data, tmp_path):
    expected = reference_run(SPEC, data, 6, "adamw", HYPER)
    first = train_hybrid(SPEC, data, 2, MeshShape(dp=2, pp=2, tp=2), m=2, hyper=HYPER, save_to=tmp_path / "a")
    second = train_hybrid(SPEC, data, 2, MeshShape(dp=4, pp=2), m=2, hyper=HYPER, start=2,
                          resume_from=tmp_path / "a", save_to=tmp_path / "b")
    third = train_single(SPEC, data, 4, 2, HYPER, tmp_path / "b")
    assert load_dense(tmp_path / "a")["layout"] == {"dp": 2, "pp": 2, "cp": 1, "tp": 2}
    assert_close("losses of 2 steps on 2x2x2, 2 on dp=4 pp=2, 2 in one process",
                 torch.tensor(first["losses"] + second["losses"] + third["losses"]),
                 torch.tensor(expected["losses"]), atol=1e-12, rtol=0)
    assert_close("parameters after the three legs", third["params"], expected["params"], atol=1e-10, rtol=0)


@pytest.mark.slow   # 8 + 8 gloo ranks: 5-10 s on 2 shared cores
def test_a_zero3_checkpoint_on_dp2_pp2_tp2_resumes_with_zero2_on_pp2_cp2_tp2(data, tmp_path):
    """ZeRO-3's parameter and moment shards, gathered by name, resharded onto a context-parallel
    mesh training with ZeRO-2: the losses of an uninterrupted run."""
    expected = reference_run(SPEC, data, 4, "adamw", HYPER)
    first = train_hybrid(SPEC, data, 2, MeshShape(dp=2, pp=2, tp=2), m=2, hyper=HYPER, save_to=tmp_path / "a",
                         zero_stage=3)
    second = train_hybrid(SPEC, data, 2, MeshShape(pp=2, cp=2, tp=2), m=2, hyper=HYPER, start=2,
                          resume_from=tmp_path / "a", zero_stage=2)
    assert_close("losses of 2 steps on 2x2x2 with ZeRO-3, 2 on pp=2 cp=2 tp=2 with ZeRO-2",
                 torch.tensor(first["losses"] + second["losses"]), torch.tensor(expected["losses"]), atol=1e-12, rtol=0)
    assert_close("parameters after the two legs", second["params"], expected["params"], atol=1e-10, rtol=0)


def test_a_rank_killed_mid_save_leaves_the_previous_checkpoint(data, tmp_path):
    train_hybrid(SPEC, data, 1, MeshShape(dp=2, pp=2), m=1, hyper=HYPER, save_to=tmp_path)
    before = load_dense(tmp_path)
    with pytest.raises(RankDied, match="rank 2 died"):
        train_hybrid(SPEC, data, 1, MeshShape(dp=2, pp=2), m=1, hyper=HYPER, start=1, resume_from=tmp_path,
                     save_to=tmp_path, die_rank=2, timeout=10)
    assert latest_step(tmp_path) == 1
    assert (tmp_path / "step_00000002").exists() and not (tmp_path / "step_00000002" / "index.pt").exists()
    after = load_dense(tmp_path)
    assert_close("the previous checkpoint, loaded again", after["param"], before["param"], atol=0, rtol=0)
    with pytest.raises(CheckpointError, match="did not complete"):
        load_dense(tmp_path, step=2)


def test_a_checkpoint_of_another_model_is_refused_before_any_rank_starts(data, tmp_path):
    train_hybrid(SPEC, data, 1, MeshShape(dp=2), m=1, hyper=HYPER, save_to=tmp_path)
    other = {**SPEC, "config": {**CONFIG, "d_model": 32}}
    with pytest.raises(CheckpointError, match="d_model=16 in the checkpoint, 32 here"):
        train_hybrid(other, data, 1, MeshShape(dp=2), m=1, hyper=HYPER, start=1, resume_from=tmp_path)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        load_dense(tmp_path / "empty")
