"""Mixed precision from scratch: dynamic loss scaling, fp32 master weights, and what fp16/bf16 can hold.

fp16 has 10 mantissa bits and 5 exponent bits: it keeps about 3 decimal digits, but nothing
above 65504 and nothing below ~6e-8. Gradients of a language model are often smaller than that,
so in fp16 they round to zero ("underflow"). Loss scaling multiplies the loss by a large S before
backward (every gradient is then S times larger, safely inside fp16's range) and divides the
gradients by S before the optimizer step. S is chosen *dynamically*: when a gradient overflows to
inf/NaN the step is skipped and S is halved; after `growth_interval` clean steps S is doubled
again, so it hovers just below the overflow limit. bf16 has fp32's 8 exponent bits (its range)
and needs no scaling, at the cost of only 7 mantissa bits.

Small updates vanish in low precision too (w + 1e-4 == w in bf16 for w = 1), so the optimizer
keeps fp32 *master* copies of the weights, steps them, and copies them down to the model.

`LossScaler` follows `torch.amp.GradScaler` step for step (same arguments, same skip / back-off /
growth rule, same fp32 arithmetic), which tests/test_amp.py checks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

__all__ = ["FloatFormat", "float_format", "round_to", "ulp", "LossScaler", "MasterWeights"]


# -- what a float format can represent (for the lab's plots) -----------------------------------

@dataclass(frozen=True)
class FloatFormat:
    """The numbers that describe a binary floating-point format."""
    dtype: torch.dtype
    bits: int
    mantissa_bits: int          # stored fraction bits (the leading 1 is implicit)
    max: float                  # largest finite value
    smallest_normal: float      # below it precision degrades (subnormals)
    smallest_subnormal: float   # below half of it everything rounds to 0
    eps: float                  # gap between 1 and the next representable value


def float_format(dtype: torch.dtype) -> FloatFormat:
    """Range and precision of a floating-point dtype (from torch.finfo, plus the subnormal)."""
    fi = torch.finfo(dtype)
    mantissa = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23, torch.float64: 52}.get(dtype)
    if mantissa is None:  # fp8 formats and friends: derive from eps = 2^-mantissa
        mantissa = int(round(-torch.log2(torch.tensor(fi.eps, dtype=torch.float64)).item()))
    return FloatFormat(dtype, fi.bits, mantissa, float(fi.max), float(fi.smallest_normal),
                       float(fi.smallest_normal) * float(fi.eps), float(fi.eps))


def round_to(x: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor:
    """x rounded to `dtype` (round to nearest even, as a cast does), returned in fp64 so the
    rounding error x - round_to(x, dtype) can be plotted."""
    x = torch.as_tensor(x, dtype=torch.float64)
    return x.to(dtype).to(torch.float64)


def ulp(x: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor:
    """Gap between |x| and the next larger representable value of `dtype` (in fp64): eps times
    the power of two at or below |x|, and a constant (the smallest subnormal) below the normals."""
    fmt = float_format(dtype)
    x = torch.as_tensor(x, dtype=torch.float64).abs()
    exponent = torch.floor(torch.log2(x.clamp_min(fmt.smallest_normal)))
    return torch.exp2(exponent) * fmt.eps


# -- dynamic loss scaling -----------------------------------------------------------------------

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"


class LossScaler:
    """Dynamic loss scaling with torch.amp.GradScaler's semantics.

    Per iteration: `scaler.scale(loss).backward()`, optionally `scaler.unscale_(opt)` (to clip
    the true gradients), `scaler.step(opt)` (skipped when any gradient is inf/NaN), then
    `scaler.update()`: back off (scale *= backoff_factor) after a skipped step, grow
    (scale *= growth_factor) after `growth_interval` clean steps in a row.

    The scale is an fp32 tensor and gradients are multiplied by its fp32 reciprocal, exactly as
    GradScaler does, so the two agree bit for bit. `device` is where the scale lives; None means
    "the device of the first loss passed to scale()".
    """

    def __init__(self, device: str | torch.device | None = None, init_scale: float = 2.0 ** 16,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True):
        if growth_factor <= 1.0:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor}")
        if not isinstance(growth_interval, int) or growth_interval <= 0:
            raise ValueError(f"growth_interval must be a positive int, got {growth_interval}")
        self.device = None if device is None else torch.device(device)
        self.init_scale, self.growth_factor, self.backoff_factor = init_scale, growth_factor, backoff_factor
        self.growth_interval, self.enabled = growth_interval, enabled
        self._scale: torch.Tensor | None = None          # created lazily on the loss's device
        self._growth_tracker = 0                          # clean steps since the last change
        self._per_optimizer: dict[int, dict[str, Any]] = {}

    def _lazy_init(self, device: torch.device) -> None:
        if self._scale is None:
            self._scale = torch.full((), self.init_scale, dtype=torch.float32, device=self.device or device)

    def _state(self, optimizer) -> dict[str, Any]:
        return self._per_optimizer.setdefault(id(optimizer), {"stage": _READY, "found_inf": None})

    def scale(self, outputs):
        """outputs * scale (a tensor, or a list/tuple of them). Identity when disabled."""
        if not self.enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            self._lazy_init(outputs.device)
            return outputs * self._scale.to(outputs.device)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise TypeError(f"scale() expects a tensor or a list/tuple of tensors, got {type(outputs).__name__}")

    @torch.no_grad()
    def unscale_(self, optimizer) -> None:
        """Divide the optimizer's gradients by the scale in place and record whether any is inf/NaN.
        At most once per optimizer between two update() calls (GradScaler's rule)."""
        if not self.enabled:
            return
        state = self._state(optimizer)
        if state["stage"] == _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] == _STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        if self._scale is None:
            raise RuntimeError("unscale_() called before scale(): there is no scale yet.")
        inv_scale = self._scale.double().reciprocal().float()   # as GradScaler: fp64 reciprocal, fp32 multiply
        found_inf = torch.zeros((), dtype=torch.float32, device=self._scale.device)
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.dtype == torch.float16:
                    raise ValueError("Attempting to unscale FP16 gradients: keep fp32 master weights "
                                     "(MasterWeights) and unscale their gradients instead.")
                g = p.grad
                if not torch.isfinite(g).all():
                    found_inf.fill_(1.0)
                g.mul_(inv_scale.to(g.device))
        state["found_inf"] = found_inf
        state["stage"] = _UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """optimizer.step() unless an inf/NaN gradient was found (then the step is skipped and
        None returned). Unscales first if unscale_ was not called this iteration."""
        if not self.enabled:
            return optimizer.step(*args, **kwargs)
        state = self._state(optimizer)
        if state["stage"] == _STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] == _READY:
            self.unscale_(optimizer)
        result = None
        if state["found_inf"].item() == 0.0:
            result = optimizer.step(*args, **kwargs)
        state["stage"] = _STEPPED
        return result

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """Back off if any optimizer saw inf/NaN this iteration, else count a clean step and grow
        every growth_interval clean steps (only to a finite value). Then start a new iteration."""
        if not self.enabled:
            return
        if self._scale is None:
            raise RuntimeError("update() called before scale(): there is no scale yet.")
        if new_scale is not None:
            self._scale.fill_(float(new_scale))
        else:
            found = [s["found_inf"] for s in self._per_optimizer.values() if s["found_inf"] is not None]
            if not found:
                raise AssertionError("No inf checks were recorded prior to update().")
            if sum(float(f.item()) for f in found) > 0:
                self._scale.mul_(self.backoff_factor)
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self.growth_interval:
                    grown = self._scale * self.growth_factor
                    if torch.isfinite(grown):
                        self._scale.copy_(grown)
                    self._growth_tracker = 0
        self._per_optimizer = {}

    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled, init_scale before first use)."""
        if not self.enabled:
            return 1.0
        return self.init_scale if self._scale is None else float(self._scale.item())

    def get_growth_tracker(self) -> int:
        return self._growth_tracker

    def is_enabled(self) -> bool:
        return self.enabled

    def state_dict(self) -> dict[str, Any]:
        """Same keys as GradScaler.state_dict(), so either can load the other's."""
        if not self.enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if not state:
            raise RuntimeError("The source state dict is empty, possibly because it was saved from a disabled scaler.")
        self.init_scale = float(state["scale"])
        if self._scale is not None:
            self._scale.fill_(self.init_scale)
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        self._growth_tracker = int(state["_growth_tracker"])


# -- fp32 master weights ------------------------------------------------------------------------

class MasterWeights:
    """An optimizer wrapper for a model held in fp16/bf16: it steps fp32 copies of the weights.

    step(): gradients copied up to fp32, the inner optimizer (built by `optimizer_factory` on
    the fp32 copies) steps them, through `scaler` when given, and the results are rounded back
    into the model's parameters. The fp32 gradients are freed after each step, so between steps
    memory holds 2+2 bytes per parameter in the model plus 4 (master) + the optimizer's state:
    the 16 bytes per parameter of mixed-precision Adam (ZeRO paper, K = 12).
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], optimizer_factory: Callable[..., torch.optim.Optimizer],
                 **optimizer_kwargs):
        self.model_params = [p for p in params if p.requires_grad]
        self.master_params = [p.detach().to(torch.float32).clone().requires_grad_(True) for p in self.model_params]
        self.optimizer = optimizer_factory(self.master_params, **optimizer_kwargs)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @torch.no_grad()
    def copy_grads_up(self) -> None:
        """master.grad = fp32(model.grad); a still-scaled inf stays inf, for the scaler to see."""
        for p, master in zip(self.model_params, self.master_params):
            master.grad = None if p.grad is None else p.grad.to(torch.float32)

    @torch.no_grad()
    def copy_params_down(self) -> None:
        """model param = master rounded to the model's dtype."""
        for p, master in zip(self.model_params, self.master_params):
            p.copy_(master)

    def step(self, scaler: LossScaler | Any | None = None):
        """One optimizer step on the fp32 copies; returns what the inner step returned (None when
        the scaler skipped it). Call scaler.update() afterwards, as with a plain optimizer."""
        self.copy_grads_up()
        result = self.optimizer.step() if scaler is None else scaler.step(self.optimizer)
        self.copy_params_down()
        for master in self.master_params:
            master.grad = None
        return result

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.model_params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(),
                "master": [m.detach().clone() for m in self.master_params]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        with torch.no_grad():
            for master, saved in zip(self.master_params, state["master"]):
                master.copy_(saved)
        self.copy_params_down()
