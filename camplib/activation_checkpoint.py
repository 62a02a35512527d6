"""Activation checkpointing from scratch: keep a block's input, recompute its inside in backward.

Autograd normally saves every intermediate a backward formula needs (attention probabilities,
the MLP's 4x-wide hidden layer...): memory linear in layers x batch x sequence. Checkpointing a
block runs its forward under no_grad (nothing saved but the block's input) and, when backward
reaches the block, reruns the forward with grad enabled and backpropagates through that fresh
graph. Cost: about one extra forward (~+30% time for a transformer); saving: everything inside
the block (Chen et al. 2016, "Training deep nets with sublinear memory cost").

Two details make the recomputation identical to the original: the RNG state (so dropout drops
the same units) and the autocast state are captured in forward and restored in backward.
Like torch.utils.checkpoint(use_reentrant=True), this version supports .backward() (not
torch.autograd.grad) and needs at least one input that requires grad.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch import nn

__all__ = ["checkpoint", "CheckpointFunction", "enable_checkpointing"]


def _devices_of(tensors) -> list[int]:
    return sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"})


class CheckpointFunction(torch.autograd.Function):
    """forward(run_fn, preserve_rng, *args): run_fn(*args) without saving intermediates."""

    @staticmethod
    def forward(ctx, run_fn: Callable[..., Any], preserve_rng: bool, *args):
        ctx.run_fn, ctx.preserve_rng = run_fn, preserve_rng
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        ctx.cuda_devices = _devices_of(tensors)
        device_type = "cuda" if ctx.cuda_devices else "cpu"
        ctx.autocast = (device_type, torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type))
        if preserve_rng:
            ctx.cpu_rng = torch.get_rng_state()
            ctx.cuda_rng = [torch.cuda.get_rng_state(d) for d in ctx.cuda_devices]
        # where each tensor argument goes back in the argument list
        ctx.tensor_index = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        ctx.other_args = [None if isinstance(a, torch.Tensor) else a for a in args]
        ctx.save_for_backward(*tensors)
        with torch.no_grad():
            return run_fn(*args)

    @staticmethod
    def backward(ctx, *grad_outputs):
        args = list(ctx.other_args)
        inputs = []
        for i, t in zip(ctx.tensor_index, ctx.saved_tensors):
            leaf = t.detach().requires_grad_(t.requires_grad)
            args[i] = leaf
            inputs.append(leaf)
        device_type, autocast_on, autocast_dtype = ctx.autocast
        with torch.random.fork_rng(devices=ctx.cuda_devices, enabled=ctx.preserve_rng):
            if ctx.preserve_rng:
                torch.set_rng_state(ctx.cpu_rng)
                for d, state in zip(ctx.cuda_devices, ctx.cuda_rng):
                    torch.cuda.set_rng_state(state, d)
            with torch.enable_grad(), torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_on):
                outputs = ctx.run_fn(*args)
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs)
                 if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        input_grads = iter(leaf.grad if leaf.requires_grad else None for leaf in inputs)
        grads = [next(input_grads) if i in ctx.tensor_index else None for i in range(len(args))]
        return (None, None, *grads)


def checkpoint(fn: Callable[..., Any], *args, preserve_rng_state: bool = True):
    """fn(*args), keeping only `args` for backward and recomputing fn there. Without grad
    (inference) it is a plain call. Keyword arguments: bind them into fn (functools.partial)."""
    if not torch.is_grad_enabled():
        return fn(*args)
    return CheckpointFunction.apply(fn, preserve_rng_state, *args)


def _checkpointed_forward(block: nn.Module, x, cache=None, attn_mask=None, positions=None):
    # KV-cache decoding is inference: nothing to save, so no checkpoint
    if cache is not None or not torch.is_grad_enabled():
        return type(block).forward(block, x, cache=cache, attn_mask=attn_mask, positions=positions)
    run = functools.partial(type(block).forward, block, attn_mask=attn_mask, positions=positions)
    return checkpoint(run, x)


def enable_checkpointing(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Checkpoint every Block of a camplib.model.GPT (model.blocks): each block then keeps only
    its input for backward. The blocks stay the same modules (state_dict names unchanged): only
    their forward is replaced, and enabled=False restores it. Returns the model."""
    for block in model.blocks:
        if enabled:
            block.forward = functools.partial(_checkpointed_forward, block)
        elif "forward" in block.__dict__:
            del block.forward
    return model
