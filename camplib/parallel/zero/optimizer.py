"""ZeRO (Rajbhandari et al. 2019) from scratch: data parallelism without N copies of everything.

Plain data parallelism keeps on every rank the parameters, the gradients and the optimizer
state: with mixed-precision Adam (2 + 2 + 12) bytes per parameter. ZeRO cuts the redundant
copies into N shards, one per rank, in three stages:

- stage 1: the optimizer state (fp32 master, exp_avg, exp_avg_sq). Gradients are
  reduce-scattered, each rank steps AdamW on its shard only, then the updated shards are
  all-gathered back into the full parameters: AFTER the step, or the update is lost.
- stage 2: + the gradients. A rank keeps only its gradient shard. The parameters are cut into
  buckets of about `bucket_mb` MB in reverse order (backward produces the last layers'
  gradients first); as soon as backward has produced every gradient of a bucket (a
  post-accumulate-grad hook per parameter) the bucket is reduce-scattered into the shard and
  its full gradients are freed. During backward a rank so holds its gradient shard, the
  gradients of the buckets still being filled (with gradients in reverse order: one bucket,
  at most bucket_mb + one parameter) and, during a reduce-scatter, one flat copy of that
  bucket: not the full gradients (measured: tests/camplib/parallel/zero/test_optimizer.py).
  A bucket bigger than the model means one bucket: the full gradients, once, at the end.
- stage 3: + the parameters. A rank keeps its parameter shard; a unit (a transformer block, a
  layer) is all-gathered just before its forward and again before its backward, and freed
  after each (module and tensor hooks). Parameters outside the units (embeddings, tied head)
  form a root unit gathered for the whole forward and backward.

Everything runs on flat buffers: a unit's parameters (a bucket for stages 0-2, a module for
stage 3) are laid end to end, padded to a multiple of N, and the model's parameters become views
of that buffer, so "rank r owns elements [r*S, (r+1)*S)" is a single slice and every collective
is one call. `stage=0` is plain data
parallelism (all-reduce, full optimizer) on the same code, the baseline of the comparisons.
Communication per step and rank: stages 0-2 send 2(N-1)/N * Ψ elements, stage 3 3(N-1)/N * Ψ.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from camplib.dist.ring import TorchCollectives
from camplib.optim import AdamW

from camplib.parallel.data.wrapper import make_buckets

__all__ = ["FlatUnit", "ZeroAdamW", "default_units"]


class FlatUnit:
    """Parameters that travel together: one flat buffer (padded to a multiple of N) whose views
    are the parameters, and the slice [lo, lo + shard_size) this rank owns."""

    def __init__(self, params: list[nn.Parameter], rank: int, world_size: int, sharded: bool):
        self.params = params
        self.numels = [p.numel() for p in params]
        numel = sum(self.numels)
        self.padded = -(-numel // world_size) * world_size
        self.shard_size = self.padded // world_size if sharded else self.padded
        self.lo = rank * self.shard_size if sharded else 0
        first = params[0]
        self.full = torch.zeros(self.padded, dtype=first.dtype, device=first.device)
        with torch.no_grad():
            self.full[:numel].copy_(torch.cat([p.detach().reshape(-1) for p in params]))
        offset = 0
        for p, n in zip(params, self.numels):
            p.data = self.full[offset:offset + n].view(p.shape)
            offset += n
        self.gathered = True
        self.shard: torch.Tensor = self.own(self.full)   # stage 3 replaces it by a copy (ZeroAdamW)
        self.ready = 0            # gradients produced in the current backward
        self.reduced = False      # gradients reduced since the last optimizer step

    def own(self, flat: torch.Tensor) -> torch.Tensor:
        return flat[self.lo:self.lo + self.shard_size]

    def flat_grads(self) -> torch.Tensor:
        """The gradients, concatenated and padded (zeros where a parameter got none)."""
        grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params]
        grads.append(self.full.new_zeros(self.padded - sum(self.numels)))
        return torch.cat(grads)

    def grads_as_views(self, buffer: torch.Tensor) -> None:
        """Make every .grad a view of `buffer`: backward then accumulates straight into it."""
        offset = 0
        for p, n in zip(self.params, self.numels):
            view = buffer[offset:offset + n].view(p.shape)
            if p.grad is not None and p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)    # someone replaced .grad (model.zero_grad(), say): keep its value
            p.grad = view
            offset += n

    # -- stage 3: the full buffer exists only while the unit is in use ----------------------
    def free(self) -> None:
        """Release the full parameters' memory; the views keep their shapes, not their bytes."""
        self.full.untyped_storage().resize_(0)
        self.gathered = False

    def gather(self, shard: torch.Tensor, collectives) -> None:
        if self.gathered:
            return
        gathered = collectives.all_gather(shard)
        self.full.untyped_storage().resize_(self.padded * self.full.element_size())
        with torch.no_grad():
            self.full.data.copy_(gathered)   # .data: refilling is not an in-place op autograd tracks
        self.gathered = True


def default_units(model: nn.Module) -> list[nn.Module]:
    """The submodules stage 3 gathers one at a time: a GPT's blocks, a Sequential's layers.
    What they leave out goes to the root unit."""
    if isinstance(getattr(model, "blocks", None), nn.ModuleList):
        return list(model.blocks)
    if isinstance(model, nn.Sequential):
        return [m for m in model if any(True for _ in m.parameters())]
    return []


class ZeroAdamW:
    """An optimizer under ZeRO stage 0-3: AdamW by default (camplib.optim's, i.e. torch.optim.AdamW's
    math), or any element-wise torch optimizer, as torch's ZeroRedundancyOptimizer takes one.

    Build it after the model is on its device and in its dtype, on every rank with the same
    initial weights. Train with `opt.zero_grad(); loss.backward(); opt.step()`.

    `optimizer_class(shards, **optimizer_kwargs)` is built on this rank's master shards only
    (one flat tensor per bucket or unit), so its state (AdamW's exp_avg and exp_avg_sq, SGD's
    momentum buffer) has Ψ/N elements per rank from stage 1 on: ZeRO shards whatever the state
    is. That is exact for optimizers whose update is element by element (SGD, Adam, AdamW,
    RMSprop, Adagrad...): a slice of a flat buffer is stepped as the whole tensors would be.
    One that looks at a whole tensor (a norm per layer as in LAMB, a matrix shape as in Muon or
    Adafactor) would see slices instead and must not be used here. `**optimizer_kwargs`: lr,
    betas, eps, weight_decay, momentum...; the class's own defaults apply otherwise.

    The optimizer steps master weights in `master_dtype`; None (the default) means the
    parameters' own dtype when it is fp32 or wider, else fp32. So bf16/fp16 parameters get an
    fp32 master copy of the shard (mixed precision, K = 12 bytes of state per parameter with
    AdamW), while fp32 (or fp64) parameters are their own master (K = 8, or 16 in fp64): the
    shard of the parameters is stepped in place. `bucket_mb`: the size of the gradient buckets
    of stages 0-2 (stage 3 gathers and reduces module by module, see `units`). `units`: the
    modules stage 3 gathers one at a time (default: `default_units`); stages 0-2 give each its own
    bucket, the rest bucketed by size (camplib.parallel.hybrid.trainer keeps a tied embedding alone: its
    shard is then the same slice of the table on the two pipeline stages that hold it).
    """

    def __init__(self, model: nn.Module, stage: int, optimizer_class: type[torch.optim.Optimizer] | None = None, *,
                 collectives=None, group=None, master_dtype: torch.dtype | None = None,
                 units: list[nn.Module] | None = None, bucket_mb: float = 25.0, **optimizer_kwargs):
        if stage not in (0, 1, 2, 3):
            raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage}")
        self.model, self.stage = model, stage
        self.collectives = collectives or TorchCollectives(group)
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.master_dtype = master_dtype
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.units, self.root = [], None      # stage 3: (module, unit) pairs and the rest
        if stage == 3:
            owned = set()
            for module in (units if units is not None else default_units(model)):
                params = [p for p in module.parameters() if p.requires_grad and p not in owned]
                owned.update(params)
                if params:
                    self.units.append((module, self._new_unit(params)))
            rest = [p for p in trainable if p not in owned]
            self.root = self._new_unit(rest) if rest else None
            self.flat_units = [u for _, u in self.units] + ([self.root] if self.root else [])
        else:                 # buckets, in the order backward produces the gradients; `units` each alone
            alone = [[p for p in m.parameters() if p.requires_grad] for m in (units or [])]
            taken = {id(p) for ps in alone for p in ps}
            buckets = make_buckets([p for p in trainable if id(p) not in taken][::-1], int(bucket_mb * 2**20))
            self.flat_units = [self._new_unit(ps) for ps in alone if ps] + [self._new_unit(b.params) for b in buckets]
        self.masters = [self._new_master(u) for u in self.flat_units]
        self.optimizer = (optimizer_class or AdamW)(self.masters, **optimizer_kwargs)
        self.grad_full = self.grad_shards = None
        if stage <= 1:        # full gradients live on, as views of one buffer per unit
            self.grad_full = [torch.zeros_like(u.full) for u in self.flat_units]
            for u, buf in zip(self.flat_units, self.grad_full):
                u.grads_as_views(buf)
        else:                 # a gradient shard per unit; full gradients only inside backward
            self.grad_shards = [u.full.new_zeros(u.shard_size) for u in self.flat_units]
            for i, u in enumerate(self.flat_units):
                for p in u.params:
                    p.register_post_accumulate_grad_hook(lambda _p, i=i: self._grad_ready(i))
        if stage == 3:
            self._install_stage3_hooks()

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def _new_unit(self, params):
        return FlatUnit(params, self.rank, self.world_size, sharded=self.stage >= 1)

    def _new_master(self, unit: FlatUnit) -> nn.Parameter:
        own = unit.own(unit.full)
        if self.stage == 3:                # the unit's own copy outlives the full buffer
            unit.shard = own.detach().clone()
        else:
            unit.shard = own               # a view: stepping it updates the model in place
        dtype = self.master_dtype or torch.promote_types(unit.full.dtype, torch.float32)
        if unit.full.dtype == dtype:
            return nn.Parameter(unit.shard, requires_grad=False)   # shares storage with the shard
        return nn.Parameter(unit.shard.detach().to(dtype), requires_grad=False)

    # -- stage 2/3: reduce-scatter each unit as soon as its gradients are complete -----------
    def _grad_ready(self, index: int) -> None:
        unit = self.flat_units[index]
        unit.ready += 1
        if unit.ready == len(unit.params):
            self._reduce_unit(index)

    def _reduce_unit(self, index: int) -> None:
        unit = self.flat_units[index]
        shard = self.collectives.reduce_scatter(unit.flat_grads())
        self.grad_shards[index].add_(shard.div_(self.world_size))
        for p in unit.params:
            p.grad = None                  # the full gradient is not needed any more
        unit.ready, unit.reduced = 0, True
        if self.stage == 3:
            unit.free()                    # and neither are the full parameters

    # -- stage 3 hooks ------------------------------------------------------------------------
    def _install_stage3_hooks(self) -> None:
        for module, unit in self.units:
            module.register_forward_pre_hook(lambda m, args, u=unit: u.gather(u.shard, self.collectives))
            module.register_forward_hook(lambda m, args, out, u=unit: self._after_forward(u, out))
        if self.root is not None:
            self.model.register_forward_pre_hook(lambda m, args: self.root.gather(self.root.shard, self.collectives))
        for u in self.flat_units:
            u.free()

    def _after_forward(self, unit: FlatUnit, output) -> None:
        unit.free()
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        for t in outputs:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(lambda grad, u=unit: u.gather(u.shard, self.collectives))

    # -- the step -------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> None:
        for i, unit in enumerate(self.flat_units):
            if self.stage <= 1:
                unit.grads_as_views(self.grad_full[i])
                grad = self._sync_full_grads(i)
            else:
                if not unit.reduced or unit.ready:   # parameters that got no gradient this step
                    self._reduce_unit(i)
                grad = self.grad_shards[i]
            master = self.masters[i]
            master.grad = grad if grad.dtype == master.dtype else grad.to(master.dtype)
        self.optimizer.step()
        for i, unit in enumerate(self.flat_units):
            master = self.masters[i]
            master.grad = None
            if master.data_ptr() != unit.shard.data_ptr():
                unit.shard.copy_(master)          # fp32 master -> low-precision shard
            if self.stage in (1, 2):
                unit.full.copy_(self.collectives.all_gather(unit.shard))   # AFTER the step
            unit.reduced = False

    def _sync_full_grads(self, index: int) -> torch.Tensor:
        buf, unit = self.grad_full[index], self.flat_units[index]
        if self.stage == 0:
            self.collectives.all_reduce(buf)
            return buf.div_(self.world_size)
        own = unit.own(buf)
        own.copy_(self.collectives.reduce_scatter(buf).div_(self.world_size))
        return own

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients. Stages 0/1 zero their gradient buffers in place (the .grad views stay)."""
        if self.stage <= 1:
            for buf, unit in zip(self.grad_full, self.flat_units):
                buf.zero_()
                unit.grads_as_views(buf)
        else:
            for shard in self.grad_shards:
                shard.zero_()
            for p in self.model.parameters():
                p.grad = None

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """name -> full parameter (gathered for stage 3): identical on every rank."""
        gathered_here = [u for u in self.flat_units if not u.gathered]   # stage 3 only
        for u in gathered_here:
            u.gather(u.shard, self.collectives)
        out = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        for u in gathered_here:
            u.free()
        return out
