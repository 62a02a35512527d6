"""GPTQ (Frantar et al. 2022): quantize a layer's weight column by column, fixing the error as it goes.

Round-to-nearest (RTN) quantizes every weight on its own. What matters is the layer's *output* on
real inputs X (n, in): ||X W^T - X Q^T||^2 = sum over rows of (w - q) H (w - q)^T with
H = 2/n X^T X. GPTQ quantizes the input columns in order; after column i is rounded, the error
(w_i - q_i) / [H^-1]_ii is spread over the not-yet-quantized columns along row i of the
(upper Cholesky factor of the) inverse Hessian, so they compensate for it (Optimal Brain
Quantization, made fast: one Cholesky, updates batched in blocks of 128 columns).

Quantizer: zero-point, `bits` bits, one scale and zero per `group_size` input columns of each row,
taken from the *current* (already updated) weights when the group starts, as the reference code
does. Dampening adds 1% of the mean diagonal to H so that it stays invertible.

A whole model (`quantize_model_gptq`) is quantized the paper's way: block by block, each
Linear's Hessian taken from the calibration inputs that reach it through the *already quantized*
earlier blocks, so later layers compensate for the errors of earlier ones too. The embedding and
the LM head stay as they are. `quantize_model_rtn` is the baseline with the same quantizer; both
return a quantized copy (dequantized weights, the model's dtype) and leave the model unchanged.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from camplib.quant.formats import dequantize_zero_point, quantize_zero_point

__all__ = ["hessian", "gptq_quantize", "rtn_quantize", "output_error", "block_linears", "quantize_model_rtn",
           "quantize_model_gptq"]


def hessian(x: torch.Tensor) -> torch.Tensor:
    """H = 2/n X^T X from inputs (..., in), in fp64 for the factorisations."""
    x = x.reshape(-1, x.shape[-1]).double()
    return 2.0 / x.shape[0] * x.t() @ x


def _check(w: torch.Tensor, group_size: int) -> None:
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"GPTQ quantizes a 2-D floating-point weight (out, in), got {w.dtype} of shape {tuple(w.shape)}")
    if w.shape[1] % group_size:
        raise ValueError(f"group_size {group_size} does not divide in_features {w.shape[1]} of the weight of shape "
                         f"{tuple(w.shape)}")


def rtn_quantize(w: torch.Tensor, bits: int = 4, group_size: int = 128) -> torch.Tensor:
    """Round-to-nearest with the same quantizer: the baseline GPTQ improves on."""
    _check(w, group_size)
    q, s, z = quantize_zero_point(w.float(), bits, group_size)
    return dequantize_zero_point(q, s, z, group_size).to(w.dtype)


def gptq_quantize(w: torch.Tensor, h: torch.Tensor, bits: int = 4, group_size: int = 128, damp: float = 0.01,
                  block: int = 128) -> torch.Tensor:
    """The dequantized GPTQ weight (same shape and dtype as w) for the Hessian h of its inputs."""
    _check(w, group_size)
    if h.shape != (w.shape[1], w.shape[1]):
        raise ValueError(f"the Hessian must be ({w.shape[1]}, {w.shape[1]}) for a weight of shape {tuple(w.shape)}, "
                         f"got {tuple(h.shape)}")
    W = w.double().clone()
    H = h.double().clone()
    dead = torch.diag(H) == 0                     # inputs that are always 0: any weight works, pick 0
    H[dead, dead] = 1
    W[:, dead] = 0
    H += damp * torch.diag(H).mean() * torch.eye(H.shape[0], dtype=H.dtype, device=H.device)
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    Q = torch.zeros_like(W)
    cols = W.shape[1]
    scale = zero = None
    for i1 in range(0, cols, block):
        i2 = min(i1 + block, cols)
        W1, Err1, Hinv1 = W[:, i1:i2].clone(), torch.zeros_like(W[:, i1:i2]), Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if col % group_size == 0:
                _, scale, zero = quantize_zero_point(W[:, col:col + group_size].float(), bits, "channel")
                scale, zero = scale.double(), zero.double()
            qmax = 2 ** bits - 1
            q = torch.clamp(torch.round(W1[:, i:i + 1] / scale) + zero, 0, qmax)
            q = (scale * (q - zero)).squeeze(1)
            Q[:, col] = q
            err = (W1[:, i] - q) / Hinv1[i, i]
            W1[:, i:] -= err.unsqueeze(1) @ Hinv1[i, i:].unsqueeze(0)
            Err1[:, i] = err
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]
    return Q.to(w.dtype)


def output_error(w_hat: torch.Tensor, w: torch.Tensor, x: torch.Tensor) -> float:
    """Mean squared difference of the layer's outputs X W^T on inputs x."""
    x = x.reshape(-1, x.shape[-1]).double()
    return float((x @ (w_hat.double() - w.double()).t()).pow(2).mean())


def block_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """Every nn.Linear inside model.blocks, by its name in the model (what the model-level
    functions quantize: not the embedding, not the LM head)."""
    return {f"blocks.{i}.{name}": m for i, block in enumerate(model.blocks)
            for name, m in block.named_modules() if isinstance(m, nn.Linear)}


def _check_groups(model: nn.Module, group_size: int) -> None:
    for name, lin in block_linears(model).items():
        if lin.in_features % group_size:
            raise ValueError(f"group_size {group_size} does not divide in_features {lin.in_features} of {name} "
                             f"(weight of shape {tuple(lin.weight.shape)})")


def quantize_model_rtn(model: nn.Module, bits: int = 4, group_size: int = 128) -> nn.Module:
    """A copy of the model with every block Linear's weight rounded to nearest (rtn_quantize)."""
    _check_groups(model, group_size)
    q = copy.deepcopy(model)
    with torch.no_grad():
        for lin in block_linears(q).values():
            lin.weight.copy_(rtn_quantize(lin.weight, bits, group_size))
    return q


def _embed(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """What the first block of camplib's GPT sees: token (+ learned position) embeddings."""
    x = model.tok_emb(idx)
    if getattr(model, "pos_emb", None) is not None:
        x = x + model.pos_emb(torch.arange(idx.shape[1], device=idx.device))
    return x


@torch.no_grad()
def quantize_model_gptq(model: nn.Module, calib: torch.Tensor, bits: int = 4, group_size: int = 128,
                        batch_size: int = 4, damp: float = 0.01) -> nn.Module:
    """A GPTQ-quantized copy of camplib's GPT (tok_emb, optional pos_emb, blocks): block by block,
    the Hessian 2/n X^T X of each Linear from the calibration token ids `calib` (n, T) as they
    reach it through the earlier, already quantized blocks; all Linears of a block see the
    block's original inputs (one pass collects them all), as in the reference code."""
    _check_groups(model, group_size)
    q = copy.deepcopy(model)
    training = q.training
    q.eval()
    device = next(q.parameters()).device
    x = torch.cat([_embed(q, chunk.to(device)) for chunk in calib.split(batch_size)])
    for block in q.blocks:
        layers = {name: m for name, m in block.named_modules() if isinstance(m, nn.Linear)}
        sums = {name: torch.zeros(lin.in_features, lin.in_features, dtype=torch.float64, device=lin.weight.device)
                for name, lin in layers.items()}
        counts = dict.fromkeys(layers, 0)

        def record(name):
            def hook(_module, args):
                inp = args[0].reshape(-1, args[0].shape[-1]).double()
                sums[name].addmm_(inp.t(), inp)
                counts[name] += inp.shape[0]
            return hook

        handles = [lin.register_forward_pre_hook(record(name)) for name, lin in layers.items()]
        try:
            for chunk in x.split(batch_size):
                block(chunk)
        finally:
            for h in handles:
                h.remove()
        for name, lin in layers.items():
            lin.weight.copy_(gptq_quantize(lin.weight, 2.0 / counts[name] * sums[name], bits, group_size, damp))
        x = torch.cat([block(chunk) for chunk in x.split(batch_size)])    # what the next block sees
    return q.train(training)
