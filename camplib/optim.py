"""AdamW and gradient-norm clipping, written out so every line of the update is visible.

Adam keeps two running averages per parameter: the gradient (momentum, `exp_avg`) and its
square (`exp_avg_sq`), and moves each weight by exp_avg / sqrt(exp_avg_sq): a step whose size
is about `lr` whatever the gradient's scale. Both averages start at zero, so early on they are
too small; dividing by (1 - beta**t) undoes that ("bias correction"). AdamW (Loshchilov &
Hutter 2019) shrinks the weights directly (p -= lr * wd * p) instead of adding wd * p to the
gradient, where Adam's normalisation would cancel most of its effect.

The state uses torch's names (`step`, `exp_avg`, `exp_avg_sq`; `step` a float32 tensor), so a
state_dict moves between this optimizer and torch.optim.AdamW in either direction.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

__all__ = ["AdamW", "PlainAdamW", "adamw_update_", "clip_grad_norm_", "decay_param_groups"]


class AdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's update (amsgrad=False, maximize=False), one parameter at a time.

    fused=True runs the same update as one kernel over all the parameters of a group,
    torch._fused_adamw_ (what torch.optim.AdamW(fused=True) runs): the formula of
    `adamw_update_` below in one pass over memory instead of ~8 element-wise passes and ~8 Python
    calls per parameter, which is most of the optimizer's cost for a small model. Its arithmetic
    order differs, so it equals the default path within rounding (tests/camplib/test_optim.py:
    2e-6 relative on the weights after 5 steps) and torch.optim.AdamW(fused=True) bit for bit.
    The state is the same (`step` on the parameter's device, as torch's fused path keeps it).
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, *, fused: bool = False):
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"need lr, eps, weight_decay >= 0, got {lr}, {eps}, {weight_decay}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"need 0 <= beta < 1, got betas={betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, fused=fused))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]  # frozen or unused: no update, no state
            if any(p.grad.is_sparse for p in params):
                raise RuntimeError("AdamW does not support sparse gradients")
            if group.get("fused"):
                self._fused_step(params, group)
                continue
            for p in params:
                adamw_update_(p, p.grad, self.state[p], group["lr"], group["betas"], group["eps"],
                              group["weight_decay"])
        return loss

    def _fused_step(self, params: list[torch.Tensor], group: dict) -> None:
        """The group's update in torch's fused kernel, one call per (device, dtype)."""
        by_kind: dict[tuple, list[torch.Tensor]] = {}
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            by_kind.setdefault((p.device, p.dtype), []).append(p)
        beta1, beta2 = group["betas"]
        for same in by_kind.values():
            states = [self.state[p] for p in same]
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, 1)
            torch._fused_adamw_(same, [p.grad for p in same], [s["exp_avg"] for s in states],
                                [s["exp_avg_sq"] for s in states], [], steps, amsgrad=False, lr=group["lr"],
                                beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
                                maximize=False, grad_scale=None, found_inf=None)


@torch.no_grad()
def adamw_update_(p: torch.Tensor, grad: torch.Tensor, state: dict, lr: float, betas: tuple[float, float],
                  eps: float, weight_decay: float) -> None:
    """One AdamW step of `p` in place, its moments in `state` (created on the first step): the
    update of torch.optim.AdamW (amsgrad=False, maximize=False), and the one home of it here.

    Bit for bit torch's default on the CPU (its single-tensor path, `_single_tensor_adam` in
    torch/optim/adam.py: CPU tensors get neither the foreach nor the fused kernels unless asked):
    the same operations in the same order, so every rounding is the same. Mathematically equal
    forms round differently: m.mul_(b1).add_(g, alpha=1-b1) is ~1 ulp away from m.lerp_(g, 1-b1),
    and Adam's division by sqrt(v) turns that into ~1e-7 on the weights within a few steps
    (tests/camplib/test_optim.py checks torch.equal). CUDA's default (foreach) orders the
    arithmetic differently: equal there within rounding only.
    """
    beta1, beta2 = betas
    if not state:
        state["step"] = torch.tensor(0.0)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    m, v = state["exp_avg"], state["exp_avg_sq"]
    state["step"] += 1
    t = state["step"].item()
    # 1. decoupled weight decay, on the weights before the Adam step
    if weight_decay != 0:
        p.mul_(1 - lr * weight_decay)
    # 2. the moments: m = b1 m + (1 - b1) g, written as torch does, m + (1 - b1)(g - m) (lerp)
    m.lerp_(grad, 1 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)      # v = b2 v + (1 - b2) g^2
    # 3. bias corrections, as Python floats: lr / (1 - b1^t) folded into the step size, and
    #    sqrt(1 - b2^t) as `** 0.5` (libm's pow, which may round differently from math.sqrt)
    step_size = lr / (1 - beta1 ** t)
    bias_correction2_sqrt = (1 - beta2 ** t) ** 0.5
    # 4. denominator: sqrt(v) / sqrt(1 - b2^t), then + eps (eps outside the sqrt)
    denom = (v.sqrt() / bias_correction2_sqrt).add_(eps)
    # 5. p -= step_size * m / denom, in one fused op
    p.addcdiv_(m, denom, value=-step_size)


class PlainAdamW:
    """AdamW (`adamw_update_`) on a list of tensors, without torch.optim.Optimizer: its constructor
    imports torch's compiler stack on first use (torch._dynamo and sympy, 2-3 s of CPU in a fresh
    process, such as each grading sandbox). For short loops that need no state_dict, param groups
    or hooks; set `lr` between steps for a schedule."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        self.params = list(params)
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay
        self.state: dict[int, dict] = {}

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        for i, p in enumerate(self.params):
            if p.grad is not None:
                adamw_update_(p, p.grad, self.state.setdefault(i, {}), self.lr, self.betas, self.eps,
                              self.weight_decay)

    def minimize_step(self, loss: torch.Tensor, max_norm: float | None = None) -> float:
        """One step of a plain loop: fresh gradients of `loss`, clipped to `max_norm` (global L2,
        clip_grad_norm_) when given, then the update. Returns the loss as a float."""
        self.zero_grad()
        loss.backward()
        if max_norm is not None:
            clip_grad_norm_(self.params, max_norm)
        self.step()
        return loss.item()


def clip_grad_norm_(params: Iterable[torch.Tensor] | torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale all gradients together so their global L2 norm is at most max_norm; return the norm
    before clipping. One global factor keeps the update's direction, only its length shrinks.

    As torch.nn.utils.clip_grad_norm_: the factor is max_norm / (norm + 1e-6) capped at 1, and
    it is applied even when it is 1 (no branch, so no GPU -> CPU sync).
    """
    if isinstance(params, torch.Tensor):
        params = [params]
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    per_tensor = torch.stack([g.detach().pow(2).sum().sqrt() for g in grads])
    total_norm = per_tensor.pow(2).sum().sqrt()
    factor = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(factor.to(g.device, g.dtype))
    return total_norm


def decay_param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two param groups: matrices (Linear and Embedding weights) decay, the rest (biases, norm
    gains) do not, as in GPT-2 / nanoGPT: shrinking a LayerNorm gain or a bias toward zero is
    not regularisation, it just fights the model. Tied weights appear once."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]
