"""Ring collectives from point-to-point messages: how all-reduce really moves bytes.

With N ranks on a ring, all-reduce = reduce-scatter + all-gather. The tensor is cut into N
chunks; in each of N-1 reduce-scatter steps every rank sends one chunk to its right neighbour
and adds the chunk arriving from its left, so after N-1 steps rank r holds the full sum of
chunk r. N-1 all-gather steps then pass the finished chunks around. Each rank sends
2(N-1)/N * S bytes in total, independent of N: that is why the ring is bandwidth-optimal.

Chunk convention (the same as `dist.reduce_scatter_tensor`): rank r owns `flat.chunk(N)[r]`.
`TorchCollectives` and `RingCollectives` give the same three operations, so code that needs
collectives (DataParallel, ZeRO) can run on torch's fast ones or on the ring, whose bytes
`camplib.dist.counting` can measure.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["ring_neighbours", "exchange", "ring_reduce_scatter", "ring_all_gather", "ring_all_reduce", "TorchCollectives",
           "RingCollectives"]


def ring_neighbours(group=None) -> tuple[int, int, int, int]:
    """(rank, N, right, left): this rank in `group`, and the global ranks it sends to and hears from."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    to_global = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
    return rank, n, to_global((rank + 1) % n), to_global((rank - 1) % n)


def exchange(send: list[torch.Tensor], recv: list[torch.Tensor], right: int, left: int, group=None) -> None:
    """Send tensors to the right neighbour while receiving as many into `recv` from the left one
    (all posted before any is waited for: two blocking sends facing each other could deadlock)."""
    ops = [dist.P2POp(dist.isend, t.contiguous(), right, group) for t in send]
    ops += [dist.P2POp(dist.irecv, t, left, group) for t in recv]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def ring_reduce_scatter(flat: torch.Tensor, group=None) -> torch.Tensor:
    """Rank r returns the sum over ranks of `flat.chunk(N)[r]` (flat.numel() divisible by N)."""
    rank, n, right, left = ring_neighbours(group)
    if flat.numel() % n:
        raise ValueError(f"ring_reduce_scatter: {flat.numel()} elements do not split into {n} equal chunks")
    chunks = [c.clone() for c in flat.reshape(-1).chunk(n)]
    incoming = torch.empty_like(chunks[0])
    for step in range(n - 1):
        # send the partial sum of chunk (rank - step - 1); receive chunk (rank - step - 2)
        send_idx, recv_idx = (rank - step - 1) % n, (rank - step - 2) % n
        exchange([chunks[send_idx]], [incoming], right, left, group)
        chunks[recv_idx] += incoming
    return chunks[rank]


def ring_all_gather(chunk: torch.Tensor, group=None) -> torch.Tensor:
    """Concatenation, in rank order, of every rank's `chunk` (all the same size)."""
    rank, n, right, left = ring_neighbours(group)
    chunks = [torch.empty_like(chunk) for _ in range(n)]
    chunks[rank] = chunk.reshape(-1).clone()
    for step in range(n - 1):
        send_idx, recv_idx = (rank - step) % n, (rank - step - 1) % n
        exchange([chunks[send_idx]], [chunks[recv_idx]], right, left, group)
    return torch.cat(chunks)


def ring_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """In-place sum over ranks of `tensor` (any shape), as reduce-scatter + all-gather."""
    n = dist.get_world_size(group)
    if n == 1:
        return tensor
    flat = tensor.detach().reshape(-1)
    pad = (-flat.numel()) % n
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    full = ring_all_gather(ring_reduce_scatter(flat, group), group)
    with torch.no_grad():
        tensor.copy_(full[:tensor.numel()].view_as(tensor))
    return tensor


# torch 2.13 renamed reduce_scatter_tensor / all_gather_into_tensor to *_single (the old names
# warn, and a warning on a rank lands on a graded notebook's stderr); older torch has only those.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class TorchCollectives:
    """torch.distributed's own collectives (fast, what production code uses): all-reduce,
    reduce-scatter and all-gather into/from one flat tensor."""

    def __init__(self, group=None):
        self.group = group

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, group=self.group)
        return tensor

    def reduce_scatter(self, flat: torch.Tensor) -> torch.Tensor:
        n = dist.get_world_size(self.group)
        out = flat.new_empty(flat.numel() // n)
        _reduce_scatter(out, flat.contiguous(), group=self.group)
        return out

    def all_gather(self, chunk: torch.Tensor) -> torch.Tensor:
        n = dist.get_world_size(self.group)
        out = chunk.new_empty(chunk.numel() * n)
        _all_gather(out, chunk.contiguous(), group=self.group)
        return out


class RingCollectives(TorchCollectives):
    """The same operations on the ring above: slower, but every byte is a visible send."""

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return ring_all_reduce(tensor, self.group)

    def reduce_scatter(self, flat: torch.Tensor) -> torch.Tensor:
        return ring_reduce_scatter(flat, self.group)

    def all_gather(self, chunk: torch.Tensor) -> torch.Tensor:
        return ring_all_gather(chunk, self.group)
