"""The communication of tensor and sequence parallelism (Megatron-LM): a few collectives and the
autograd functions that put them in forward or backward.

Every operator here comes with its *conjugate*: what the forward does, the backward undoes
(transposed). The layers in `camplib.parallel.tensor.layers` never call a collective directly, only these
functions, so this file is all the communication a tensor-parallel model does:

    copy_to_tp (f)        forward identity     backward all-reduce   (before a column layer)
    reduce_from_tp (g)    forward all-reduce   backward identity     (after a row layer)
    gather_from_tp        forward all-gather   backward keep my slice (column layer, gather_output)
    gather_from_sp        forward all-gather   backward reduce-scatter (sequence shards -> column layer)
    reduce_scatter_to_sp  forward reduce-scatter backward all-gather   (row layer -> sequence shards)

`group` is the tensor-parallel process group (None: the default group). The collectives use the
list forms (`dist.all_gather`, `dist.reduce_scatter`): torch 2.13 routes `all_gather_into_tensor`
through `ProcessGroup.all_gather_single`, which `camplib.dist.counting` does not count.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = [
    "all_gather_along",
    "all_reduce_max",
    "all_reduce_sum",
    "copy_to_tp",
    "gather_from_sp",
    "gather_from_tp",
    "local_chunk",
    "reduce_from_tp",
    "reduce_scatter_along",
    "reduce_scatter_to_sp",
    "tp_rank",
    "tp_size",
]


def tp_rank(group=None) -> int:
    return dist.get_rank(group) if dist.is_initialized() else 0


def tp_size(group=None) -> int:
    """Ranks in the tensor-parallel group (1 without torch.distributed: layers then run dense)."""
    return dist.get_world_size(group) if dist.is_initialized() else 1


# -- collectives (out of place, any dimension) ---------------------------------------------------
def all_reduce_sum(x: torch.Tensor, group=None, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """The sum (or `op`: MAX, ...) of every rank's `x`, in a new tensor (`x` is left alone)."""
    if tp_size(group) == 1:
        return x
    x = x.contiguous().clone()
    dist.all_reduce(x, op=op, group=group)
    return x


def all_reduce_max(x: torch.Tensor, group=None) -> torch.Tensor:
    return all_reduce_sum(x, group, op=dist.ReduceOp.MAX)


def all_gather_along(x: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """Concatenate every rank's `x` along `dim`, in rank order."""
    if tp_size(group) == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(tp_size(group))]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=dim)


def reduce_scatter_along(x: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """Sum `x` over the ranks and keep this rank's chunk along `dim`."""
    t = tp_size(group)
    if t == 1:
        return x
    if x.size(dim) % t:
        raise ValueError(f"reduce-scatter: size {x.size(dim)} of dim {dim} is not divisible by {t} ranks")
    parts = [c.contiguous() for c in x.chunk(t, dim=dim)]
    out = torch.empty_like(parts[0])
    dist.reduce_scatter(out, parts, group=group)
    return out


def local_chunk(x: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """This rank's chunk of `x` along `dim` (no communication)."""
    t = tp_size(group)
    if x.size(dim) % t:
        raise ValueError(f"cannot split size {x.size(dim)} of dim {dim} into {t} equal chunks")
    return x.chunk(t, dim=dim)[tp_rank(group)].contiguous()


# -- conjugate autograd functions ----------------------------------------------------------------
class _CopyToTP(torch.autograd.Function):
    """f: every rank feeds the same input to its shard, so the input's gradient is the sum of
    every shard's contribution."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce_sum(grad, ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    """g: the shards' partial sums become the full output; every rank holds the same gradient."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce_sum(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    """All-gather the last dimension (column outputs); backward keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_gather_along(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return local_chunk(grad, -1, ctx.group), None


class _GatherFromSP(torch.autograd.Function):
    """Sequence shards -> full sequence; backward sums every rank's gradient and scatters it."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return all_gather_along(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_along(grad, ctx.dim, ctx.group), None, None


class _ReduceScatterToSP(torch.autograd.Function):
    """Partial sums over the full sequence -> summed sequence shards; backward all-gathers."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return reduce_scatter_along(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_along(grad, ctx.dim, ctx.group), None, None


def copy_to_tp(x: torch.Tensor, group=None) -> torch.Tensor:
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group=None) -> torch.Tensor:
    return _ReduceFromTP.apply(x, group)


def gather_from_tp(x: torch.Tensor, group=None) -> torch.Tensor:
    return _GatherFromTP.apply(x, group)


def gather_from_sp(x: torch.Tensor, dim: int = 1, group=None) -> torch.Tensor:
    return _GatherFromSP.apply(x, dim, group)


def reduce_scatter_to_sp(x: torch.Tensor, dim: int = 1, group=None) -> torch.Tensor:
    return _ReduceScatterToSP.apply(x, dim, group)
