"""One Linear cut down to some of its rows (outputs) and columns (inputs): the step every structured
pruning here ends with (camplib.compress.pruning for the course's GPT, encoder_shrink for MiniLM)."""
from __future__ import annotations

import torch
from torch import nn


def sliced_linear(lin: nn.Linear, rows=None, cols=None, requires_grad: bool | None = None) -> nn.Linear:
    """A new Linear holding lin's weight[rows][:, cols] and bias[rows], in fresh storage (the old
    tensors can be freed). `requires_grad`: the new weight's flag; None copies lin's."""
    w = lin.weight.detach()
    w = w[rows] if rows is not None else w
    w = w[:, cols] if cols is not None else w
    out = nn.Linear(w.shape[1], w.shape[0], bias=lin.bias is not None, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        out.weight.copy_(w)
        if lin.bias is not None:
            out.bias.copy_(lin.bias.detach()[rows] if rows is not None else lin.bias.detach())
    flag = lin.weight.requires_grad if requires_grad is None else requires_grad
    out.weight.requires_grad_(flag)
    return out

