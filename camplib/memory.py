"""Where training memory goes: parameters, gradients, optimizer state and activations.

For Adam, the first three are fixed per parameter (Ψ of them): in fp32, 4 (weights) + 4
(gradients) + 8 (exp_avg, exp_avg_sq) = 16Ψ bytes; in mixed precision, 2 + 2 + 12 (fp32 master
copy + the two moments) = 16Ψ as well (ZeRO, Rajbhandari et al. 2019, K = 12): mixed precision
saves activation memory and time, not optimizer memory. Activations (tensors the forward saves
for backward) grow with batch x sequence x layers and usually dominate; activation
checkpointing (camplib.activation_checkpoint) trades them for recomputation.

`measure_memory` counts what is really there (unique storages, so tied or viewed tensors count
once); `adam_memory_estimate` is the formula. The tests check one against the other: exactly on
the CPU, and against torch.cuda.memory_allocated on a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Iterable

import torch

__all__ = ["MemoryReport", "storage_key", "storage_bytes", "parameter_bytes", "gradient_bytes", "optimizer_state_bytes",
           "saved_activation_bytes", "SavedActivations", "measure_memory", "adam_memory_estimate", "dtype_bytes"]


@dataclass
class MemoryReport:
    """Bytes per category. `master_weights` is the fp32 copy kept by mixed precision (0 otherwise)."""
    params: int = 0
    grads: int = 0
    optimizer_state: int = 0
    master_weights: int = 0
    activations: int = 0

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def __str__(self) -> str:
        parts = [f"{f.name} {getattr(self, f.name) / 2**20:.2f} MiB" for f in fields(self)]
        return ", ".join(parts) + f" | total {self.total / 2**20:.2f} MiB"


def dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def storage_key(t: torch.Tensor) -> tuple[str, int]:
    """What identifies the memory behind `t`: views and tied weights share it."""
    return (str(t.device), t.untyped_storage().data_ptr())


def storage_bytes(tensors: Iterable[torch.Tensor], exclude: set[tuple[str, int]] | None = None) -> int:
    """Bytes of the distinct storages behind `tensors` (a view or a tied weight counts once),
    leaving out storages whose key is in `exclude`."""
    seen = set(exclude or ())
    total = 0
    for t in tensors:
        if t is None or t.device.type == "meta":
            continue
        key = storage_key(t)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def parameter_bytes(model: torch.nn.Module) -> int:
    return storage_bytes(model.parameters())


def gradient_bytes(model: torch.nn.Module) -> int:
    return storage_bytes(p.grad for p in model.parameters() if p.grad is not None)


def _state_tensors(state: Any):
    if isinstance(state, torch.Tensor):
        yield state
    elif isinstance(state, dict):
        for v in state.values():
            yield from _state_tensors(v)
    elif isinstance(state, (list, tuple)):
        for v in state:
            yield from _state_tensors(v)


def optimizer_state_bytes(optimizer) -> int:
    """Bytes of every tensor in optimizer.state (Adam: exp_avg, exp_avg_sq and the 4-byte `step`
    scalar per parameter tensor). Accepts a camplib.amp.MasterWeights (its inner optimizer)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    return storage_bytes(_state_tensors(list(inner.state.values())))


def saved_activation_bytes(fn: Callable[..., Any], *args, exclude: Iterable[torch.Tensor] = (),
                           grad_inputs: bool = False, **kwargs):
    """(bytes, output): run fn(*args, **kwargs) and count the distinct storages autograd saves for
    backward, leaving out those that existed before (the tensors in `exclude`, typically the
    parameters, and the arguments). Keep `output` alive while you look at memory: dropping it
    frees the graph and the activations with it.

    grad_inputs=True runs fn on leaf copies of the floating-point arguments that require grad:
    a function without parameters (an attention kernel) records no graph, and saves nothing,
    unless its inputs need gradients."""
    if grad_inputs:
        args = tuple(a.detach().clone().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point()
                     else a for a in args)
    existing = {storage_key(t) for t in list(exclude) + [a for a in args if isinstance(a, torch.Tensor)]}
    saved: dict[tuple[str, int], int] = {}

    def pack(t: torch.Tensor):
        key = storage_key(t)
        if key not in existing and t.device.type != "meta":
            saved[key] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args, **kwargs)
    return sum(saved.values()), out


class SavedActivations:
    """`with SavedActivations(exclude) as acts:` counts the storages autograd saves for backward
    while the block runs, as they live: a storage counts from the first save until the last
    saved tensor on it is released (its graph freed by backward), so `acts.peak` is the most
    bytes of activations held at once, across forwards and backwards in any order (a pipeline
    schedule's micro-batches in flight). `exclude()` returns the storage keys that are not
    activations (the parameters), asked at every save: stage-3 ZeRO re-allocates them."""

    def __init__(self, exclude: Callable[[], set] = set):
        self.exclude, self.live, self.peak = exclude, 0, 0
        self._refs: dict[tuple[str, int], list[int]] = {}      # key -> [saved tensors on it, bytes]
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor):
        key = storage_key(t)
        if t.device.type == "meta" or key in self.exclude():
            return t
        ref = self._refs.setdefault(key, [0, t.untyped_storage().nbytes()])
        if ref[0] == 0:
            self.live += ref[1]
            self.peak = max(self.peak, self.live)
        ref[0] += 1
        return _Saved(t, key, self)

    @staticmethod
    def _unpack(saved):
        return saved.tensor if isinstance(saved, _Saved) else saved

    def _release(self, key) -> None:
        ref = self._refs[key]
        ref[0] -= 1
        if ref[0] == 0:
            self.live -= ref[1]
            del self._refs[key]

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)


class _Saved:
    """What autograd holds instead of a saved tensor: it tells the counter when it is dropped."""
    __slots__ = ("tensor", "key", "owner")

    def __init__(self, tensor, key, owner):
        self.tensor, self.key, self.owner = tensor, key, owner

    def __del__(self):
        self.owner._release(self.key)


def measure_memory(model: torch.nn.Module, optimizer=None, forward: Callable[[], Any] | None = None) -> MemoryReport:
    """What is allocated now for `model` (parameters, gradients present), `optimizer` (its state,
    and the fp32 master copies when it is a camplib.amp.MasterWeights) and, when `forward` is
    given, the activations one call of forward() saves for backward."""
    report = MemoryReport(params=parameter_bytes(model), grads=gradient_bytes(model))
    if optimizer is not None:
        report.optimizer_state = optimizer_state_bytes(optimizer)
        masters = getattr(optimizer, "master_params", None)
        if masters is not None:
            report.master_weights = storage_bytes(masters)
            report.grads += storage_bytes(m.grad for m in masters if m.grad is not None)
    if forward is not None:
        existing = list(model.parameters()) + list(model.buffers())   # e.g. RoPE tables: not activations
        report.activations, _ = saved_activation_bytes(forward, exclude=existing)
    return report


def adam_memory_estimate(n_params: int, param_dtype: torch.dtype = torch.float32, mixed_precision: bool = False,
                         n_param_tensors: int = 0) -> MemoryReport:
    """The formula for (Adam)W with Ψ = n_params: params and grads Ψ x bytes of param_dtype,
    moments 2Ψ x bytes of the dtype the optimizer steps (fp32 masters in mixed precision), and, in mixed precision, a 4Ψ fp32 master copy. torch's Adam also
    keeps a 4-byte `step` tensor per parameter tensor: pass n_param_tensors to count it (the
    paper's formula leaves it out)."""
    b = dtype_bytes(param_dtype)
    state_dtype_bytes = 4 if mixed_precision else b   # torch's Adam keeps moments in the param's dtype
    return MemoryReport(params=n_params * b, grads=n_params * b,
                        optimizer_state=2 * n_params * state_dtype_bytes + 4 * n_param_tensors,
                        master_weights=4 * n_params if mixed_precision else 0)
