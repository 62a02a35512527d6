"""Communication compression for data-parallel gradients: send fewer bytes, keep the training.

- Quantized all-reduce: the ring all-reduce (camplib.dist.ring) with every message compressed,
  to fp16 (2 bytes per value) or to int8 with one fp32 absmax scale per block of values
  (s = max|x| / 127, q = round(x / s): about 1 byte per value). Each of the N-1 reduce-scatter
  hops quantizes a partial sum again, so errors add up: per element at most
  N * (sum over ranks of max|x_r|) / 254 for int8 (half a step of the coarsest scale, N times),
  and N * (sum over ranks of max|x_r|) * 2^-11 for fp16. The finished chunks are quantized once
  and forwarded as they are, so every rank ends with the very same tensor.
- Top-k sparsification with error feedback (Stich et al. 2018, Lin et al. 2018 "Deep Gradient
  Compression"): send only the k largest entries of gradient + residual, and keep what was not
  sent as the residual, added to the next step's gradient. Nothing is lost, only delayed: the sum
  of what was sent over T steps equals the sum of the true gradients minus the current residual.

`camplib.parallel.data.compression_run.compression_loss_curves` trains the same small model with each
method on N ranks (the lab's plot); this module does not import it.
"""
from __future__ import annotations

import torch

from camplib.dist.ring import exchange, ring_all_gather, ring_neighbours

__all__ = ["quantize_int8", "dequantize_int8", "compressed_all_reduce", "topk_error_feedback",
           "sparse_all_reduce"]


def quantize_int8(x: torch.Tensor, block: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Absmax int8 per block of `block` values (x.numel() divisible by block): (q int8, scales fp32)."""
    blocks = x.reshape(-1, block).float()
    scales = blocks.abs().amax(dim=1) / 127.0
    q = torch.round(blocks / scales.clamp_min(torch.finfo(torch.float32).tiny)[:, None]).clamp_(-127, 127)
    return q.to(torch.int8).reshape(-1), scales


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return (q.reshape(scales.numel(), -1).float() * scales[:, None]).reshape(-1)


def _encode(x: torch.Tensor, method: str, block: int) -> list[torch.Tensor]:
    if method == "fp16":
        return [x.to(torch.float16)]
    if method == "int8":
        return list(quantize_int8(x, block))
    if method == "none":
        return [x.clone()]
    raise ValueError(f"unknown compression {method!r} (expected 'none', 'fp16' or 'int8')")


def _decode(msg: list[torch.Tensor], method: str, dtype: torch.dtype) -> torch.Tensor:
    return (dequantize_int8(*msg) if method == "int8" else msg[0]).to(dtype)


def _pass_on(send: list[torch.Tensor], right: int, left: int, group) -> list[torch.Tensor]:
    """Send a message (its tensors) right; receive one of the same shapes from the left."""
    received = [torch.empty_like(t) for t in send]
    exchange(send, received, right, left, group)
    return received


def compressed_all_reduce(tensor: torch.Tensor, method: str = "int8", block: int = 256, group=None) -> torch.Tensor:
    """In-place sum over ranks of `tensor` on a ring whose messages are compressed (`method`:
    "none", "fp16" or "int8" absmax per block). Every rank ends with the same values."""
    rank, n, right, left = ring_neighbours(group)
    if n == 1:
        return tensor
    flat = tensor.detach().reshape(-1).float()
    pad = (-flat.numel()) % (n * block if method == "int8" else n)   # int8: whole blocks per chunk
    chunks = [c.clone() for c in torch.cat([flat, flat.new_zeros(pad)]).chunk(n)]
    for step in range(n - 1):                      # reduce-scatter, one compressed hop at a time
        send_idx, recv_idx = (rank - step - 1) % n, (rank - step - 2) % n
        got = _pass_on(_encode(chunks[send_idx], method, block), right, left, group)
        chunks[recv_idx] += _decode(got, method, torch.float32)
    messages: list = [None] * n
    messages[rank] = _encode(chunks[rank], method, block)
    for step in range(n - 1):                      # all-gather: forward the finished messages as they are
        send_idx, recv_idx = (rank - step) % n, (rank - step - 1) % n
        messages[recv_idx] = _pass_on(messages[send_idx], right, left, group)
    full = torch.cat([_decode(m, method, torch.float32) for m in messages])
    with torch.no_grad():
        tensor.copy_(full[:tensor.numel()].view_as(tensor))
    return tensor


def topk_error_feedback(grad: torch.Tensor, residual: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(update, new_residual): `update` keeps the k entries of grad + residual largest in
    magnitude (zeros elsewhere, same shape); `new_residual` is what was not sent."""
    corrected = grad + residual
    flat = corrected.reshape(-1)
    idx = flat.abs().topk(min(k, flat.numel())).indices
    update = torch.zeros_like(flat)
    update[idx] = flat[idx]
    update = update.view_as(corrected)
    return update, corrected - update


def sparse_all_reduce(update: torch.Tensor, k: int, group=None) -> torch.Tensor:
    """Sum over ranks of a tensor with at most k non-zeros per rank, sending only
    (index, value) pairs: every rank all-gathers everyone's k indices and values on the ring,
    (N-1) * k * 8 bytes sent per rank (fp32 values, int32 indices)."""
    flat = update.reshape(-1)
    idx = flat.abs().topk(min(k, flat.numel())).indices
    all_idx = ring_all_gather(idx.to(torch.int32), group)     # k 4-byte indices from every rank
    all_val = ring_all_gather(flat[idx].contiguous(), group)  # and their k values
    out = torch.zeros_like(flat)
    out.index_add_(0, all_idx.long(), all_val)
    return out.view_as(update)
