"""Runner for hybrid training (tests, benchmarks, lab demos): a rank function plus one call of
camplib.dist.on_ranks. Every size is checked here, before any rank starts.

    out = train_hybrid(spec, data, steps, MeshShape(dp=2, pp=2, tp=2), m=2, hyper={"lr": 1e-2})
    out["losses"]            # the batch's loss per step (compare with reference_run's)
    out["bytes_per_step"]    # per rank: {collective or "send": bytes handed to it} over the steps / steps
"""
from __future__ import annotations

import torch

from camplib.dist import on_ranks
from camplib.dist.counting import count_bytes
from camplib.model import GPTConfig
from camplib.parallel.hybrid import HybridTrainer, check_hybrid
from camplib.parallel.mesh import MeshShape, ProcessMesh
from camplib.parallel.model_specs import build_model
from camplib.parallel.tensor import unshard

__all__ = ["train_hybrid"]


def _hybrid_rank(rank, world_size, spec, data, steps, shape, m, hyper, schedule, timeout):
    mesh = ProcessMesh(shape)
    trainer = HybridTrainer(build_model(spec), mesh, m, hyper, schedule, timeout, ring=True)
    held = sum(p.numel() * p.element_size() for p in trainer.stage.parameters())
    losses = []
    with count_bytes() as counter:
        for s in range(steps):
            losses.append(trainer.step(data["x"][s], data["y"][s]))
    payload = dict(counter.payload)
    payload["send"] = counter.sent
    layout = trainer.tp_model.shard_layout()
    params = {n: p.detach().clone() for n, p in trainer.stage.named_parameters()}
    return {"losses": [float("nan") if x is None else x for x in losses], "coords": mesh.coords,
            "params": params, "specs": {n: layout[n] for n in params},
            "param_bytes": held, "bytes_per_step": {k: v / max(steps, 1) for k, v in payload.items()}}


def train_hybrid(spec: dict, data: dict, steps: int, shape: MeshShape, m: int = 1, hyper: dict | None = None,
                 schedule: str = "1f1b", timeout: float = 60.0) -> dict:
    """Train `build_model(spec)` for `steps` steps on data["x"][s], data["y"][s] (the whole batch)
    on the ranks of `shape`. Returns "losses" (per step, from the last stage), "params" (the
    trained parameters joined into the dense model's, by name, from dp replica 0), per rank "coords",
    "param_bytes" (parameters it holds), "bytes_per_step", "bytes_sent"."""
    cfg = GPTConfig(**spec["config"])
    check_hybrid(shape, shape.world_size, cfg, data["x"].shape[1], data["x"].shape[2], m)
    hyper = dict(hyper or {})
    out = on_ranks(_hybrid_rank, shape.world_size, spec, data, steps, shape, m, hyper, schedule, timeout,
                   timeout=timeout, run_timeout=20 * timeout)
    last = shape.rank_of(pp=shape.pp - 1)
    return {"losses": out["losses"][last], "params": _dense_params(out, shape), "coords": out["coords"],
            "param_bytes": out["param_bytes"],
            "bytes_per_step": out["bytes_per_step"], "bytes_sent": out["bytes_sent"]}


def _dense_params(out: dict, shape: MeshShape) -> dict:
    """The dense model's parameters from dp replica 0: each stage's, its tp pieces unsharded."""
    dense = {}
    for stage in range(shape.pp):
        ranks = [shape.rank_of(pp=stage, tp=j) for j in range(shape.tp)]
        for name, spec in out["specs"][ranks[0]].items():
            dense[name] = unshard([out["params"][r][name] for r in ranks], spec)
    return dense
