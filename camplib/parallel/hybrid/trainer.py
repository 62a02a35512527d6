"""4D hybrid parallelism: camplib's GPT trained on a DP x PP x CP x TP mesh, built from the
course's pieces, nothing copied:

- TP: `TensorParallelGPT` (lab a03) on the mesh's tp group: every big weight split t ways,
  the vocabulary too (the loss never builds the full logits). `sequence_parallel=True` adds a03's
  sequence parallelism: norms, dropout and residuals on 1/t of the tokens, all-gather before and
  reduce-scatter after the TP linears; the gradients of the weights used there are summed over tp.
- CP: each rank of the cp group holds 2 of the 2cp zig-zag chunks of every sequence
  (`camplib.parallel.context.ring.split_sequence`); RoPE and learned positions use the chunks' global
  positions, attention is ring attention over the cp group (`ContextShard`), and each rank's
  loss is its tokens' sum divided by the whole sequence's token count (times cp, see below).
- PP: `PipelineStage` (lab a04) cuts that model by depth, one stage per pp coordinate; its
  messages (`PipelineComm`) go to the global ranks of the pp group; any schedule of
  `pipeline.schedule` with one chunk per rank runs (`pipeline_step`). A tied token embedding /
  LM head lives on the first and the last stage: after backward its gradient is summed over the
  mesh's "embedding" group (one all-reduce, as Megatron does), so both copies step alike.
- DP: ZeRO (`ZeroAdamW`, lab a02; `zero_stage` 1, 2 or 3) on the "dp_cp" group (the dp
  replicas and the cp shards together): gradients reduce-scattered and divided by dp*cp, AdamW on
  a 1/(dp*cp) shard of the optimizer state, parameters all-gathered back. Stage 2 reduce-scatters
  each bucket during backward (once per micro-batch) and keeps only the gradient shard; stage 3
  also keeps only a shard of each block's parameters (and of the rest of the stage: embeddings,
  final norm, head), gathered around each use. The partial gradients that must be summed first
  (below) are summed where ZeRO's hooks cannot have reduced them yet: a sequence-parallel
  weight's in a hook that runs before ZeRO's; a tied table, kept in a bucket of its own on both
  stages, as its reduced shard (the same slice of the table on both: the sums commute).

One step on a rank: its dp shard of the batch, its cp chunks of each sequence, cut into m
micro-batches, runs through the pipeline (the tp group computing every stage together), then
the tied and sequence-parallel gradients are summed and ZeRO-1 averages over dp_cp and steps.
The result equals one process training the dense GPT on the whole batch with AdamW: the cp
shards' losses cp * sum_c / n sum (over dp*cp, divided by it) to the dp replicas' mean of
per-replica means, which is the batch mean (equal shard sizes); the micro-batch losses are
divided by m; TP's layers compute the dense layers' sums.
"""
from __future__ import annotations

import torch
from torch import nn

from camplib.dist.ring import RingCollectives
from camplib.memory import storage_bytes, storage_key
from camplib.model import GPTConfig
from camplib.parallel.context.ring import ContextShard, split_sequence
from camplib.parallel.mesh import MeshShape, ProcessMesh, check_layout
from camplib.parallel.pipeline.stages import PipelineStage, pipeline_step
from camplib.parallel.pipeline.comm import PipelineComm
from camplib.parallel.pipeline.schedule import as_actions, build_schedule
from camplib.parallel.tensor.layers import sync_sequence_parallel_grads, vocab_parallel_cross_entropy
from camplib.parallel.tensor.comm import all_reduce_sum
from camplib.parallel.tensor.model import TensorParallelGPT
from camplib.parallel.zero.optimizer import ZeroAdamW

__all__ = ["HybridStage", "HybridTrainer", "check_hybrid", "shard_batch"]


def check_hybrid(shape: MeshShape, world_size: int, cfg: GPTConfig, batch: int, seq_len: int, m: int,
                 sequence_parallel: bool = False) -> None:
    """Every reason this model and batch cannot train on this mesh, before any rank starts."""
    check_layout(shape, world_size, n_layer=cfg.n_layer, n_head=cfg.n_head, n_kv_head=cfg.n_kv_head,
                 seq_len=seq_len, batch=batch, zigzag=shape.cp > 1)
    problems = []
    if shape.cp > 1 and cfg.dropout:
        problems.append(f"cp={shape.cp} with dropout={cfg.dropout}: ring attention has no dropout (use dropout=0)")
    if sequence_parallel and seq_len % (shape.cp * shape.tp):
        problems.append(f"sequence parallelism: seq_len={seq_len} is not divisible by cp*tp={shape.cp * shape.tp} "
                        "(each cp shard's tokens are split over tp)")
    local = batch // shape.dp if batch % shape.dp == 0 else None
    if local is not None and local % m:
        problems.append(f"the {local} sequences of each dp replica (batch={batch} / dp={shape.dp}) do not split "
                        f"into m={m} micro-batches")
    if seq_len > cfg.max_seq_len:
        problems.append(f"seq_len={seq_len} exceeds max_seq_len={cfg.max_seq_len}")
    if problems:
        raise ValueError(f"cannot train on mesh {shape.describe()}: " + "; ".join(problems))


class HybridStage(PipelineStage):
    """A pipeline stage of a `TensorParallelGPT`: the first stage embeds this rank's tokens at
    their global positions (context chunks, sequence-parallel slice: `token_positions`), the last
    stage's loss is the vocab-parallel cross-entropy over this rank's logit columns, summed over
    its tokens and divided by the token count of the whole sequences (summed over the cp group),
    times cp: ZeRO's mean over dp*cp then gives each replica's mean over all its tokens."""

    def __init__(self, tp_gpt: TensorParallelGPT, index: int, n_stages: int, cp_group=None):
        super().__init__(tp_gpt, index, n_stages)
        self.vocab_start, self.vocab_size = tp_gpt.tok_emb.vocab_start, tp_gpt.config.vocab_size
        self.tp_group, self.cp_group = tp_gpt.group, cp_group
        self.positions = tp_gpt.token_positions

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if self.is_first:
            h = self.tok_emb(x)           # (b, T_local, d), or 1/t of its tokens with SP
            if self.pos_emb is not None:
                h = h + self.pos_emb(self.positions(x.size(1), x.device))
            x = self.drop(h)
        for block in self.blocks.values():
            x = block(x)
        if not self.is_last:
            return x
        logits = self.lm_head(self.ln_f(x))   # (b, T_local, V_pad / t): this rank's columns
        if targets is None:
            return logits
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        total = vocab_parallel_cross_entropy(logits, targets, self.vocab_start, self.vocab_size, self.tp_group,
                                             reduction="sum")
        count = (targets != -100).sum().to(total.dtype)
        cp = torch.distributed.get_world_size(self.cp_group) if self.cp_group is not None else 1
        if cp > 1:
            count = all_reduce_sum(count, self.cp_group)   # the whole sequences' tokens
        return total * cp / count


def shard_batch(idx: torch.Tensor, targets: torch.Tensor, dp_rank: int, dp: int, cp_rank: int, cp: int):
    """This rank's part of the whole batch: its dp replica's rows, then its zig-zag chunks of
    every sequence (lab a05's exercise)."""
    idx, targets = idx.chunk(dp)[dp_rank], targets.chunk(dp)[dp_rank]
    if cp > 1:
        idx, targets = split_sequence(idx, cp_rank, cp, dim=1), split_sequence(targets, cp_rank, cp, dim=1)
    return idx, targets


class HybridTrainer:
    """This rank's part of training `dense` (a camplib GPT, the same weights on every rank) on a
    process mesh: `step(idx, targets)` takes the WHOLE batch (every rank the same tensors), keeps
    its dp shard and its cp chunks (`shard`, default `shard_batch`), runs the pipeline schedule
    and steps ZeRO (`zero_stage` 1-3). Returns the batch's loss on the last stage's ranks (the
    mean over the dp replicas), None elsewhere.
    `ring`: ZeRO's collectives on camplib's ring (slower; every byte measurable).
    `sequence_parallel`: a03's SP inside every TP region. `device`: where the model and the
    batches live (a CUDA device with NCCL; the CPU with gloo)."""

    def __init__(self, dense: nn.Module, mesh: ProcessMesh, m: int, hyper: dict, schedule: str = "1f1b",
                 timeout: float = 60.0, ring: bool = False, sequence_parallel: bool = False, device=None,
                 zero_stage: int = 1, shard=None):
        if zero_stage not in (1, 2, 3):
            raise ValueError(f"zero_stage must be 1, 2 or 3 in the hybrid, got {zero_stage}")
        self.mesh, self.m, self.timeout, self.zero_stage = mesh, m, timeout, zero_stage
        self.shard = shard or shard_batch
        self.device = torch.device(device) if device is not None else dense.tok_emb.weight.device
        pp, tp_group = mesh.size("pp"), mesh.group("tp")
        context = ContextShard(mesh.group("cp")) if mesh.size("cp") > 1 else None
        self.tp_model = TensorParallelGPT.from_dense(dense, tp_group, sequence_parallel=sequence_parallel,
                                                     context=context).to(self.device)
        self.stage = HybridStage(self.tp_model, mesh.coord("pp"), pp, mesh.group("cp"))
        self.actions = as_actions(build_schedule(schedule, pp, m))[mesh.coord("pp")]
        self.dtype = dense.tok_emb.weight.dtype
        self.tied = self.tp_model.lm_head.weight is self.tp_model.tok_emb.weight and pp > 1
        if zero_stage >= 2 and self.tp_model.sequence_parallel:   # summed over tp before ZeRO's hook reduces them
            for p in self.stage.parameters():
                if getattr(p, "sequence_parallel", False):
                    p.register_post_accumulate_grad_hook(self._sum_over_tp)
        units = list(self.stage.blocks.values()) if zero_stage == 3 else []
        if self.tied and zero_stage >= 2:   # the table in a unit of its own on both stages
            units.append(self.tp_model.tok_emb if self.stage.is_first else self.tp_model.lm_head)
        # ring=True: ZeRO's reduce-scatter and all-gather as ring sends, whose bytes count_bytes sees
        collectives = RingCollectives(mesh.group("dp_cp")) if ring else None
        self.optimizer = ZeroAdamW(self.stage, stage=zero_stage, group=mesh.group("dp_cp"), collectives=collectives,
                                   units=units, **hyper)

    def _sum_over_tp(self, p: torch.Tensor) -> None:
        p.grad.copy_(all_reduce_sum(p.grad, self.mesh.group("tp")))

    def step(self, idx: torch.Tensor, targets: torch.Tensor) -> float | None:
        dp, d = self.mesh.size("dp"), self.mesh.coord("dp")
        cp, c = self.mesh.size("cp"), self.mesh.coord("cp")
        idx, targets = (torch.as_tensor(t).to(self.device) for t in self.shard(idx, targets, d, dp, c, cp))
        micro = list(zip(idx.chunk(self.m), targets.chunk(self.m)))
        local_T = idx.size(1) // (self.mesh.size("tp") if self.tp_model.sequence_parallel else 1)
        shape = (idx.size(0) // self.m, local_T, self.tp_model.config.d_model)
        comm = PipelineComm(self.mesh.coord("pp"), self.mesh.size("pp"), self.mesh.size("pp"), shape, self.dtype,
                            self.timeout, ranks=self.mesh.members("pp"), device=self.device)
        self.optimizer.zero_grad()
        loss = pipeline_step({0: self.stage}, self.actions, micro, comm)
        self.sync_grads()
        self.optimizer.step()
        if not self.stage.is_last:
            return None
        mean = loss.detach().reshape(1).to(torch.float64) / self.mesh.size("dp_cp")
        torch.distributed.all_reduce(mean, group=self.mesh.group("dp_cp"))
        return float(mean)

    def shard_layout(self) -> dict:
        """{name here: Shard} of this stage's parameters: how each splits over tp (a tied LM head,
        the last stage's name for the token embedding, splits as the embedding does)."""
        layout = self.tp_model.shard_layout()
        if self.tp_model.lm_head.weight is self.tp_model.tok_emb.weight:
            layout["lm_head.weight"] = layout["tok_emb.weight"]
        return {n: layout[n] for n, _ in self.stage.named_parameters()}

    def sync_grads(self) -> None:
        """Sums the partial gradients backward left on this rank, before ZeRO averages over dp_cp:
        sequence-parallel weights over tp (each rank saw 1/t of the tokens), a tied embedding
        between the first and the last stage (each saw one of its two uses). ZeRO-2/3: the SP
        weights were summed in their hooks; the tied table's reduced shard is summed here."""
        if self.tp_model.sequence_parallel and self.zero_stage == 1:
            sync_sequence_parallel_grads(self.stage, self.mesh.group("tp"))
        if not (self.tied and (self.stage.is_first or self.stage.is_last)):
            return
        weight = self.tp_model.tok_emb.weight
        if self.zero_stage == 1:
            weight.grad.copy_(all_reduce_sum(weight.grad, self.mesh.group("embedding")))
            return
        zero = self.optimizer
        i = next(k for k, u in enumerate(zero.flat_units) if len(u.params) == 1 and u.params[0] is weight)
        if not zero.flat_units[i].reduced:
            zero._reduce_unit(i)
        zero.grad_shards[i].copy_(all_reduce_sum(zero.grad_shards[i], self.mesh.group("embedding")))

    def parameters_by_name(self) -> dict[str, torch.Tensor]:
        """{name: a copy of this stage's parameter (its tp piece)}; ZeRO-3 gathers them (a
        collective over dp_cp: every rank calls it)."""
        return self.optimizer.full_parameters()

    def memory_bytes(self) -> dict[str, int]:
        """Bytes this rank keeps between steps: its parameters (ZeRO-3: shards), gradients (the
        full buffers of ZeRO-1, the shards of ZeRO-2/3) and AdamW state (the two moments, and a
        master copy where it is not the parameters' own storage)."""
        zero = self.optimizer
        if self.zero_stage == 3:
            params = storage_bytes(u.shard for u in zero.flat_units)
        else:
            params = storage_bytes(self.stage.parameters())
        grads = storage_bytes(zero.grad_full if self.zero_stage == 1 else zero.grad_shards)
        moments = [t for st in zero.optimizer.state.values() for t in st.values()
                   if isinstance(t, torch.Tensor) and t.dim() > 0]
        shards = {storage_key(u.shard) for u in zero.flat_units}
        masters = [m for m in zero.masters if storage_key(m) not in shards]
        return {"params": params, "grads": grads, "optimizer": storage_bytes(moments + masters)}
