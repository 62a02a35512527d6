"""Rotary position embeddings (RoPE, Su et al. 2021).

RoPE encodes position by rotating pairs of query/key features by an angle proportional to the
position, so the score q.k depends only on the *distance* between the two tokens.

Which features form a pair is a convention, chosen by `pairing`:
- "half" (default): feature i is paired with feature i + head_dim/2 (`rotate_half`), as in
  Hugging Face's Llama (`apply_rotary_pos_emb`), GPT-NeoX and most HF checkpoints;
- "interleaved": neighbours (2i, 2i+1) form a pair, as in the RoFormer paper (Su et al., eq. 34)
  and Meta's original Llama code, which views each pair as one complex number and multiplies it
  by e^{i m theta_i} (`torch.view_as_complex`).
Pair i turns by the same angle m * theta^(-2i/d) in both; only the storage order differs. So the
two are the same model up to a permutation of each head's q and k features: Hugging Face's
convert_llama_weights_to_hf.py permutes Meta's q/k projection rows so that half-split RoPE gives
the same scores (`permute_qk_rows` here, both ways; `camplib.model.convert_rope_pairing` for a whole GPT).
With "half", Llama checkpoints from `transformers` load without any permutation.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["RotaryEmbedding", "rotate_half", "rotate_interleaved", "permute_qk_rows", "PAIRINGS"]

PAIRINGS = ("half", "interleaved")


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dim: a 90 degree turn of each pair."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_interleaved(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...): the same 90 degree turn on neighbour pairs
    (multiplying the complex number x0 + i x1 by i)."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((-odd, even), dim=-1).flatten(-2)


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables for positions 0 .. max_seq_len-1, applied to (..., T, head_dim).

    The tables are computed in fp32 exactly as HF Llama computes them, so converted models give
    the same numbers. They are non-persistent buffers: they follow `.to(device)` but are not
    saved in checkpoints (they are a function of the config, not learned).

    Call it as `rope(x, offset)` (or `rope.rotate(...)`). The method is not named `apply`
    because `nn.Module.apply(fn)` already exists and is used to initialise weights.
    """

    def __init__(self, head_dim: int, max_seq_len: int, theta: float = 10000.0, pairing: str = "half"):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        if pairing not in PAIRINGS:
            raise ValueError(f"RoPE pairing must be one of {PAIRINGS}, got {pairing!r}")
        self.head_dim, self.max_seq_len, self.theta, self.pairing = head_dim, max_seq_len, theta, pairing
        # inv_freq[i] = theta^(-2i/d): pair i turns by position * inv_freq[i] radians
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        angles = torch.arange(max_seq_len, dtype=torch.float32)[:, None] * inv_freq[None, :]
        if pairing == "half":  # (T, head_dim): feature i and i + d/2 share angle i
            angles = torch.cat((angles, angles), dim=-1)
        else:                  # features 2i and 2i+1 share angle i
            angles = angles.repeat_interleave(2, dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def rotate(self, x: torch.Tensor, offset: int = 0, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate x of shape (B, H, T, head_dim) (any leading dims) to its positions.

        By default the T tokens sit at positions offset, offset+1, ...: with a KV cache, `offset`
        is the number of tokens already cached. `positions` ((T,) or (B, T) integers) overrides
        that, e.g. for left-padded batches.
        """
        T = x.size(-2)
        if positions is None:
            if offset + T > self.max_seq_len:
                raise ValueError(f"positions up to {offset + T - 1} exceed max_seq_len={self.max_seq_len}")
            cos, sin = self.cos[offset:offset + T], self.sin[offset:offset + T]
        else:
            cos, sin = self.cos[positions], self.sin[positions]
            if positions.dim() == 2:  # (B, T, d) -> (B, 1, T, d) to broadcast over heads
                cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return self.turn(x, cos.to(x.dtype), sin.to(x.dtype))

    forward = rotate

    def turn(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate x by angles whose cos/sin (rows of the tables, broadcastable to x) are given:
        a caller rotating many tensors at the same positions looks them up once (the serving
        engine, for q and k of every layer). x * cos + rotate_half(x) * sin, computed for "half"
        pairing by `_HalfTurn` in three passes each way without rotate_half's copies."""
        if self.pairing == "half":
            if torch.is_grad_enabled() and x.requires_grad:
                return _HalfTurn.apply(x, cos, sin)
            return _half_turn(x, cos, sin, 1)   # no gradient: skip autograd.Function's ~30 us per call
        return x * cos + rotate_interleaved(x) * sin

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_seq_len={self.max_seq_len}, theta={self.theta}, pairing={self.pairing}"


class _HalfTurn(torch.autograd.Function):
    """y = x * cos + rotate_half(x) * sin for half pairing (cos, sin: equal halves, no gradient):
    y1 = x1 c - x2 s, y2 = x2 c + x1 s. Its transpose turns back: dx1 = g1 c + g2 s,
    dx2 = g2 c - g1 s. Each way one product and two half-width multiply-adds in place, where
    rotate_half's chunk, neg and cat, two products and a sum (and their backward) take ~5 passes."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        ctx.x_shape = x.shape
        return _half_turn(x, cos, sin, 1)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _half_turn(grad, cos, sin, -1).sum_to_size(ctx.x_shape), None, None


def _half_turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: int) -> torch.Tensor:
    h = x.size(-1) // 2
    out = x * cos
    out[..., :h].addcmul_(x[..., h:], sin[..., :h], value=-sign)
    out[..., h:].addcmul_(x[..., :h], sin[..., h:], value=sign)
    return out


def permute_qk_rows(weight: torch.Tensor, n_heads: int, to: str) -> torch.Tensor:
    """Reorder the output rows (features) of a q or k projection, head by head, for `to` pairing.

    to="half" takes interleaved-trained rows (Meta's order: pair i at rows 2i, 2i+1) to the
    half-split order (pair i at rows i, i + d/2): exactly `permute` in transformers'
    convert_llama_weights_to_hf.py. to="interleaved" is its inverse. Works on a weight
    (n_heads * head_dim, d_in) or a bias (n_heads * head_dim,).
    """
    if to not in PAIRINGS:
        raise ValueError(f"to must be one of {PAIRINGS}, got {to!r}")
    rows = weight.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"{rows} rows do not split into {n_heads} heads of an even size")
    rest = weight.shape[1:]
    if to == "half":  # (head, pair, 2) -> (head, 2, pair)
        w = weight.reshape(n_heads, rows // n_heads // 2, 2, *rest).transpose(1, 2)
    else:             # (head, 2, pair) -> (head, pair, 2)
        w = weight.reshape(n_heads, 2, rows // n_heads // 2, *rest).transpose(1, 2)
    return w.reshape(weight.shape).contiguous()
