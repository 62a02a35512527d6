"""From token states to one sentence vector: the mean, or attention that learns where to look.

Mean pooling (what MiniLM was trained with) weighs every token alike, so in "cancel my order and
also where is my invoice" the second request counts as much as the first, which decides.
`AttentionPooling` scores each token with a learned vector and a learned bias per position,
`s_t = w . h_t + b_t`, and averages the states with `softmax(s)` over the real tokens (padding
left out). w and b start at zero, so it starts as exactly the mean: a head fitted on mean-pooled
vectors (the linear probe) stays right, and training moves the weight towards the tokens that
decide. On a06's validation split it helps a frozen encoder's head, not MiniLM with its top layers
fine-tuned (they learn where to look themselves): benchmarks/README.md, a06_lora_settings.py.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["mean_pool", "AttentionPooling"]


def mean_pool(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N, T, H) token states, (N, T) mask of real tokens -> (N, H): their mean."""
    weights = mask.unsqueeze(-1).to(states.dtype)
    return (states * weights).sum(1) / weights.sum(1)


class AttentionPooling(nn.Module):
    """softmax(w . h_t + b_t) over the real tokens, then the weighted sum of the states; starts
    as the mean (w = 0, b = 0). Positions past `max_positions` share the last bias."""

    def __init__(self, hidden: int, max_positions: int = 64):
        super().__init__()
        self.score = nn.Linear(hidden, 1)
        self.position_bias = nn.Parameter(torch.zeros(max_positions))
        nn.init.zeros_(self.score.weight)
        nn.init.zeros_(self.score.bias)

    def weights(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(N, T) attention weights, zero on padding, each row summing to 1."""
        positions = torch.arange(states.shape[1], device=states.device).clamp(max=len(self.position_bias) - 1)
        scores = self.score(states).squeeze(-1) + self.position_bias[positions]
        return scores.masked_fill(~mask.bool(), float("-inf")).softmax(-1)

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (states * self.weights(states, mask).unsqueeze(-1)).sum(1)
