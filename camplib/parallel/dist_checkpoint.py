"""Distributed checkpoints: every rank saves its own shards, the layout is recorded, and a
checkpoint written on one mesh loads on another (2x2x2 -> 4x1x2 -> one process).

What is saved is named like the DENSE model: each tensor-parallel piece of a parameter (and of
its AdamW moments) is stored under the dense parameter's name with its `Shard` (dim, parts,
padding). Loading joins the pieces of every name back into the dense tensor (`unshard`) and the
new layout cuts it again: nothing about the old mesh has to match the new one except the model.
ZeRO-1 keeps the moments sharded over dp; before saving, the dp group all-gathers them, and only
dp replica 0 writes (the other replicas hold the same pieces).

Atomic: the ranks write their files into `step_<n>/` (each file itself written atomically by
`camplib.train_state.save_checkpoint`), wait for each other, and only then does rank 0 write
`step_<n>/index.pt` (the layout, the model config, the step, which file holds which piece) and
point `latest` at it. A rank killed mid-save leaves a folder without an index, which nothing
loads, and `latest` still names the previous, complete checkpoint.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

from camplib.train_state import CheckpointError, load_checkpoint, save_checkpoint
from camplib.parallel.tensor.layers import Shard, shard_of, unshard

__all__ = ["KINDS", "save_distributed", "load_dense", "latest_step", "moments_by_name", "load_moments"]

KINDS = ("param", "exp_avg", "exp_avg_sq")   # what is saved per parameter


def moments_by_name(trainer) -> tuple[dict[str, dict[str, torch.Tensor]], int]:
    """({kind: {name: this rank's tp piece}}, AdamW step) of a HybridTrainer: ZeRO-1's moment
    shards all-gathered over dp (every dp rank takes part) and cut into parameters."""
    names = {id(p): n for n, p in trainer.stage.named_parameters()}
    zero = trainer.optimizer
    out = {"param": trainer.parameters_by_name(), "exp_avg": {}, "exp_avg_sq": {}}   # ZeRO-3: gathered
    step = 0
    for unit, master in zip(zero.flat_units, zero.masters):
        state = zero.optimizer.state.get(master, {})
        step = int(state["step"]) if "step" in state else step
        for kind in ("exp_avg", "exp_avg_sq"):
            shard = state[kind] if kind in state else torch.zeros_like(master)
            full = zero.collectives.all_gather(shard.contiguous())
            offset = 0
            for p, n in zip(unit.params, unit.numels):
                out[kind][names[id(p)]] = full[offset:offset + n].view(p.shape).clone()
                offset += n
    return out, step


def load_moments(trainer, dense: dict[str, dict[str, torch.Tensor]], step: int, tp_rank: int, tp: int) -> None:
    """Set a fresh HybridTrainer's ZeRO-1 state from dense moments ({kind: {name: tensor}})."""
    layout = trainer.shard_layout()
    names = {id(p): n for n, p in trainer.stage.named_parameters()}
    zero = trainer.optimizer
    for unit, master in zip(zero.flat_units, zero.masters):
        state = {"step": torch.tensor(float(step))}
        for kind in ("exp_avg", "exp_avg_sq"):
            pieces = [shard_of(dense[kind][names[id(p)]], layout[names[id(p)]], tp_rank, tp).reshape(-1)
                      for p in unit.params]
            flat = torch.cat(pieces + [pieces[0].new_zeros(unit.padded - sum(unit.numels))])
            state[kind] = unit.own(flat).to(device=master.device, dtype=master.dtype).clone()
        zero.optimizer.state[master] = state


def save_distributed(root: str | os.PathLike, step: int, pieces: dict[str, dict[str, torch.Tensor]],
                     specs: dict[str, Shard], *, rank: int, writes: bool, tp_index: int, layout: dict,
                     config: dict, adam_step: int) -> Path:
    """Every rank calls it. Ranks with `writes` (dp replica 0) save `pieces` ({kind: {name:
    tensor}}) to `root/step_<step>/rank<rank>.pt`; after a barrier over all ranks rank 0 writes the
    index (every writer's names, tp index and shard specs gathered) and moves `latest`."""
    folder = Path(root) / f"step_{step:08d}"
    entry = None
    if writes:
        name = f"rank{rank:05d}.pt"
        save_checkpoint(folder / name, {"pieces": pieces})
        entry = {"file": name, "tp": tp_index, "names": sorted(pieces["param"]),
                 "specs": {n: (s.dim, tuple(s.parts), s.dense_size) for n, s in specs.items()}}
    entries = [None] * dist.get_world_size()
    dist.all_gather_object(entries, entry)       # also the barrier: nobody has failed mid-write
    if rank == 0:
        index = {"step": step, "layout": layout, "config": config, "adam_step": adam_step,
                 "files": [e for e in entries if e is not None]}
        save_checkpoint(folder / "index.pt", index)
        save_checkpoint(Path(root) / "latest.pt", {"step": step, "folder": folder.name})
    dist.barrier()
    return folder


def latest_step(root: str | os.PathLike) -> int | None:
    """The step `latest` names (a complete checkpoint), or None when there is none."""
    path = Path(root) / "latest.pt"
    return load_checkpoint(path)["step"] if path.exists() else None


def load_dense(root: str | os.PathLike, step: int | None = None, config: dict | None = None) -> dict:
    """{"step", "adam_step", "layout", "config", "param"/"exp_avg"/"exp_avg_sq": {name: dense tensor}}
    of a complete checkpoint (`latest` by default). With `config`, a checkpoint of another model
    raises a CheckpointError naming the differences, before anything is loaded."""
    step = latest_step(root) if step is None else step
    if step is None:
        raise CheckpointError(f"no complete checkpoint in {root} (no latest.pt)")
    folder = Path(root) / f"step_{step:08d}"
    if not (folder / "index.pt").exists():
        raise CheckpointError(f"{folder} has no index.pt: the save of step {step} did not complete")
    index = load_checkpoint(folder / "index.pt")
    if config is not None:
        diff = {k: (index["config"].get(k), v) for k, v in config.items() if index["config"].get(k) != v}
        if diff:
            raise CheckpointError(f"checkpoint {folder} is of another model: " +
                                  ", ".join(f"{k}={old} in the checkpoint, {new} here" for k, (old, new) in diff.items()))
    pieces: dict[str, dict[str, list]] = {k: {} for k in KINDS}
    specs = {}
    for entry in index["files"]:
        saved = load_checkpoint(folder / entry["file"])["pieces"]
        for kind in KINDS:
            for name, tensor in saved[kind].items():
                pieces[kind].setdefault(name, {})[entry["tp"]] = tensor
        specs.update(entry["specs"])
    out = {"step": index["step"], "adam_step": index["adam_step"], "layout": index["layout"], "config": index["config"]}
    for kind in KINDS:
        out[kind] = {}
        for name, by_tp in pieces[kind].items():
            dim, parts, dense_size = specs[name]
            out[kind][name] = unshard([by_tp[j] for j in sorted(by_tp)], Shard(dim, tuple(parts), dense_size))
    return out
