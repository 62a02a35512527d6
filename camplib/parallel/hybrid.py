"""3D hybrid parallelism: camplib's GPT trained on a DP x PP x TP mesh, built from the course's
pieces, nothing copied:

- TP: `TensorParallelGPT` (lab a03) on the mesh's tp group: every big weight split t ways,
  the vocabulary too (the loss never builds the full logits);
- PP: `PipelineStage` (lab a04) cuts that model by depth, one stage per pp coordinate; its
  messages (`PipelineComm`) go to the global ranks of the pp group; any schedule of
  `pipeline_schedule` runs (`pipeline_step`);
- DP: ZeRO-1 (`ZeroAdamW`, lab a02) on the dp group: gradients reduce-scattered, AdamW on a
  1/dp shard of the optimizer state, parameters all-gathered back.

One step on a rank: its dp shard of the batch, cut into m micro-batches, runs through the
pipeline (the tp group computing every stage together), then ZeRO-1 averages the gradients
over dp and steps. The result equals one process training the dense GPT on the whole batch with
AdamW: the dp replicas' mean of per-replica means is the batch mean (equal shard sizes), the
micro-batch losses are divided by m, and TP's layers compute the dense layers' sums.

Context parallelism (`camplib.parallel.context.ring_attention`) is not wired into this model
yet: the mesh has the cp dimension, and `check_hybrid` refuses cp > 1 here.
"""
from __future__ import annotations

import torch
from torch import nn

from camplib.dist.ring import RingCollectives
from camplib.model import GPTConfig
from camplib.parallel.mesh import MeshShape, ProcessMesh, check_layout
from camplib.parallel.pipeline import PipelineStage, pipeline_step
from camplib.parallel.pipeline_comm import PipelineComm
from camplib.parallel.pipeline_schedule import as_actions, build_schedule
from camplib.parallel.tensor import vocab_parallel_cross_entropy
from camplib.parallel.tensor_model import TensorParallelGPT
from camplib.parallel.zero import ZeroAdamW

__all__ = ["HybridStage", "HybridTrainer", "check_hybrid"]


def check_hybrid(shape: MeshShape, world_size: int, cfg: GPTConfig, batch: int, seq_len: int, m: int) -> None:
    """Every reason this model and batch cannot train on this mesh, before any rank starts."""
    check_layout(shape, world_size, n_layer=cfg.n_layer, n_head=cfg.n_head, n_kv_head=cfg.n_kv_head,
                 seq_len=seq_len, batch=batch, zigzag=False)
    problems = []
    if shape.cp > 1:
        problems.append(f"cp={shape.cp}: context parallelism is not wired into the hybrid GPT yet (use cp=1)")
    if shape.pp > 1 and cfg.tie_embeddings:
        problems.append(f"pp={shape.pp} with tie_embeddings=True: the tied embedding would live on two stages "
                        "(use tie_embeddings=False)")
    local = batch // shape.dp if batch % shape.dp == 0 else None
    if local is not None and local % m:
        problems.append(f"the {local} sequences of each dp replica (batch={batch} / dp={shape.dp}) do not split "
                        f"into m={m} micro-batches")
    if seq_len > cfg.max_seq_len:
        problems.append(f"seq_len={seq_len} exceeds max_seq_len={cfg.max_seq_len}")
    if problems:
        raise ValueError(f"cannot train on mesh {shape.describe()}: " + "; ".join(problems))


class HybridStage(PipelineStage):
    """A pipeline stage of a `TensorParallelGPT`: the last stage's loss is the vocab-parallel
    cross-entropy over this rank's logit columns (the dense stage's loss needs them all)."""

    def __init__(self, tp_gpt: TensorParallelGPT, index: int, n_stages: int):
        super().__init__(tp_gpt, index, n_stages)
        self.vocab_start, self.vocab_size = tp_gpt.tok_emb.vocab_start, tp_gpt.config.vocab_size
        self.tp_group = tp_gpt.group

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if not (self.is_last and targets is not None):
            return super().forward(x)
        logits = super().forward(x)               # (b, T, V_pad / t): this rank's columns
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        return vocab_parallel_cross_entropy(logits, targets, self.vocab_start, self.vocab_size, self.tp_group)


class HybridTrainer:
    """This rank's part of training `dense` (a camplib GPT, the same weights on every rank) on a
    process mesh: `step(idx, targets)` takes the WHOLE batch (every rank the same tensors), keeps
    its dp shard, runs the pipeline schedule and steps ZeRO-1. Returns the batch's loss on the
    last stage's ranks (the mean over the dp replicas), None elsewhere. `ring`: ZeRO's
    collectives on camplib's ring (slower; every byte measurable)."""

    def __init__(self, dense: nn.Module, mesh: ProcessMesh, m: int, hyper: dict, schedule: str = "1f1b",
                 timeout: float = 60.0, ring: bool = False):
        self.mesh, self.m, self.timeout = mesh, m, timeout
        pp, tp_group = mesh.size("pp"), mesh.group("tp")
        self.tp_model = TensorParallelGPT.from_dense(dense, tp_group)
        self.stage = HybridStage(self.tp_model, mesh.coord("pp"), pp)
        self.actions = as_actions(build_schedule(schedule, pp, m))[mesh.coord("pp")]
        self.dtype = dense.tok_emb.weight.dtype
        # ring=True: ZeRO's reduce-scatter and all-gather as ring sends, whose bytes count_bytes sees
        collectives = RingCollectives(mesh.group("dp")) if ring else None
        self.optimizer = ZeroAdamW(self.stage, stage=1, group=mesh.group("dp"), collectives=collectives, **hyper)

    def step(self, idx: torch.Tensor, targets: torch.Tensor) -> float | None:
        dp, d = self.mesh.size("dp"), self.mesh.coord("dp")
        idx, targets = idx.chunk(dp)[d], targets.chunk(dp)[d]
        micro = list(zip(idx.chunk(self.m), targets.chunk(self.m)))
        shape = (idx.size(0) // self.m, idx.size(1), self.tp_model.config.d_model)
        comm = PipelineComm(self.mesh.coord("pp"), self.mesh.size("pp"), self.mesh.size("pp"), shape, self.dtype,
                            self.timeout, ranks=self.mesh.members("pp"))
        self.optimizer.zero_grad()
        loss = pipeline_step({0: self.stage}, self.actions, micro, comm)
        self.optimizer.step()
        if not self.stage.is_last:
            return None
        mean = loss.detach().reshape(1).to(torch.float64) / dp
        torch.distributed.all_reduce(mean, group=self.mesh.group("dp"))
        return float(mean)
