"""Rotary position embeddings (RoPE, Su et al. 2021).

RoPE encodes position by rotating pairs of query/key features by an angle proportional to the
position, so the score q.k depends only on the *distance* between the two tokens.

Which features form a pair is a convention. We use the "half-split" one that Hugging Face Llama
uses: feature i is paired with feature i + head_dim/2 (`rotate_half`). The original paper pairs
neighbours (2i, 2i+1); weights trained with one convention need their q/k rows permuted to run
with the other. With the half-split convention Llama checkpoints load without any permutation.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["RotaryEmbedding", "rotate_half"]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dim: a 90 degree turn of each pair."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables for positions 0 .. max_seq_len-1, applied to (..., T, head_dim).

    The tables are computed in fp32 exactly as HF Llama computes them, so converted models give
    the same numbers. They are non-persistent buffers: they follow `.to(device)` but are not
    saved in checkpoints (they are a function of the config, not learned).

    Call it as `rope(x, offset)` (or `rope.rotate(...)`). The method is not named `apply`
    because `nn.Module.apply(fn)` already exists and is used to initialise weights.
    """

    def __init__(self, head_dim: int, max_seq_len: int, theta: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        self.head_dim, self.max_seq_len, self.theta = head_dim, max_seq_len, theta
        # inv_freq[i] = theta^(-2i/d): pair i turns by position * inv_freq[i] radians
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        angles = torch.arange(max_seq_len, dtype=torch.float32)[:, None] * inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)  # (T, head_dim): both halves of a pair share an angle
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
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        return x * cos + rotate_half(x) * sin

    forward = rotate

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_seq_len={self.max_seq_len}, theta={self.theta}"
