"""Runner for hybrid training (tests, benchmarks, lab demos): a rank function plus one call of
camplib.dist.on_ranks. Every size is checked here, before any rank starts.

    out = train_hybrid(spec, data, steps, MeshShape(dp=2, pp=2, tp=2), m=2, hyper={"lr": 1e-2})
    out["losses"]            # the batch's loss per step (compare with reference_run's)
    out["bytes_per_step"]    # per rank: {collective or "send": bytes handed to it} over the steps / steps
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from camplib.dist import on_ranks
from camplib.dist.counting import count_bytes
from camplib.model import GPTConfig
from camplib.parallel.dist_checkpoint import load_dense, load_moments, moments_by_name, save_distributed
from camplib.parallel.hybrid import HybridTrainer, check_hybrid
from camplib.parallel.mesh import MeshShape, ProcessMesh
from camplib.parallel.model_specs import build_model
from camplib.parallel.tensor import unshard

__all__ = ["train_hybrid", "train_single"]


def _hybrid_rank(rank, world_size, spec, data, steps, shape, m, hyper, schedule, timeout, start=0, resume=None,
                 save_to=None, die_rank=None):
    mesh = ProcessMesh(shape)
    dense = build_model(spec)
    if resume is not None:
        dense.load_state_dict(resume["param"], strict=True)
    trainer = HybridTrainer(dense, mesh, m, hyper, schedule, timeout, ring=True)
    if resume is not None:
        load_moments(trainer, resume, resume["adam_step"], mesh.coord("tp"), mesh.size("tp"))
    held = sum(p.numel() * p.element_size() for p in trainer.stage.parameters())
    losses = []
    with count_bytes() as counter:
        for s in range(start, start + steps):
            losses.append(trainer.step(data["x"][s], data["y"][s]))
    payload = dict(counter.payload)
    payload["send"] = counter.sent
    layout = trainer.tp_model.shard_layout()
    params = {n: p.detach().clone() for n, p in trainer.stage.named_parameters()}
    if save_to is not None:
        pieces, adam_step = moments_by_name(trainer)
        if rank == die_rank:     # a rank killed mid-save: half a file, then gone
            folder = Path(save_to) / f"step_{start + steps:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"rank{rank:05d}.pt").write_bytes(b"half a checkpoint")
            os._exit(1)
        save_distributed(save_to, start + steps, pieces, {n: layout[n] for n in params}, rank=rank,
                         writes=mesh.coord("dp") == 0, tp_index=mesh.coord("tp"),
                         layout={d: shape.__dict__[d] for d in ("dp", "pp", "cp", "tp")}, config=spec["config"],
                         adam_step=adam_step)
    return {"losses": [float("nan") if x is None else x for x in losses], "coords": mesh.coords,
            "params": params, "specs": {n: layout[n] for n in params},
            "param_bytes": held, "bytes_per_step": {k: v / max(steps, 1) for k, v in payload.items()}}


def train_hybrid(spec: dict, data: dict, steps: int, shape: MeshShape, m: int = 1, hyper: dict | None = None,
                 schedule: str = "1f1b", timeout: float = 60.0, *, start: int = 0, resume_from=None,
                 save_to=None, die_rank: int | None = None) -> dict:
    """Train `build_model(spec)` for `steps` steps on data["x"][s], data["y"][s] (the whole batch)
    on the ranks of `shape`. Returns "losses" (per step, from the last stage), "params" (the
    trained parameters joined into the dense model's, by name, from dp replica 0), per rank "coords",
    "param_bytes" (parameters it holds), "bytes_per_step", "bytes_sent".

    Checkpoints (camplib.parallel.dist_checkpoint): `start` is the first step's index in `data`;
    `resume_from` a folder whose latest checkpoint (of any layout) the run starts from; `save_to`
    a folder where the ranks save theirs after the last step; `die_rank` (tests) kills that rank
    in the middle of the save."""
    cfg = GPTConfig(**spec["config"])
    check_hybrid(shape, shape.world_size, cfg, data["x"].shape[1], data["x"].shape[2], m)
    resume = load_dense(resume_from, config=spec["config"]) if resume_from is not None else None
    hyper = dict(hyper or {})
    out = on_ranks(_hybrid_rank, shape.world_size, spec, data, steps, shape, m, hyper, schedule, timeout, start,
                   resume, save_to, die_rank, timeout=timeout, run_timeout=20 * timeout)
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


def train_single(spec: dict, data: dict, start: int, steps: int, hyper: dict, resume_from) -> dict:
    """One process continuing from a distributed checkpoint (any layout): the dense model and
    torch's AdamW with the checkpoint's moments, on steps start .. start + steps - 1."""
    ckpt = load_dense(resume_from, config=spec["config"])
    model = build_model(spec)
    model.load_state_dict(ckpt["param"], strict=True)
    opt = torch.optim.AdamW(model.parameters(), **hyper)
    for name, p in model.named_parameters():
        opt.state[p] = {"step": torch.tensor(float(ckpt["adam_step"])), "exp_avg": ckpt["exp_avg"][name].clone(),
                        "exp_avg_sq": ckpt["exp_avg_sq"][name].clone()}
    losses = []
    for s in range(start, start + steps):
        opt.zero_grad(set_to_none=True)
        _, loss = model(data["x"][s], data["y"][s])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}
