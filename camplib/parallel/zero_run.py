"""Run ZeRO training on N ranks and bring back plain data: final parameters, losses, bytes
held and bytes sent. What the tests, the benchmark and lab a02's graded cells use.

Models are built inside each rank from a plain spec (camplib.parallel.model_specs), so only
dicts and tensors cross processes.
Data is {"x": (steps, B, ...), "y": (steps, B, ...)}: step s uses the batch x[s], y[s]; rank r
trains on rows chunk(N)[r] (B divisible by N), so the averaged gradient is the full batch's.
The ranks' models live on the CPU and talk over gloo (one GPU cannot host several NCCL ranks).
"""
from __future__ import annotations

import warnings
from collections import Counter

import torch
import torch.distributed as dist

from camplib.dist.counting import count_bytes
from camplib.dist.launch import launch
from camplib.dist.ring import RingCollectives, TorchCollectives
from camplib.memory import storage_bytes, storage_key

from .model_specs import batch_loss, build_model

__all__ = ["build_model", "batch_loss", "make_data", "reference_adamw_run", "train_zero_on_ranks",
           "train_optimizer_on_ranks", "gradient_shards_on_ranks", "tensor_bytes", "reachable_tensor_bytes",
           "quiet_rank"]

def make_data(spec: dict, steps: int, batch: int, seed: int = 0, seq_len: int = 16) -> dict:
    """Random batches for `spec`: regression targets for an MLP, random tokens for a GPT."""
    g = torch.Generator().manual_seed(seed)
    if spec["kind"] == "mlp":
        return {"x": torch.randn(steps, batch, spec["sizes"][0], generator=g),
                "y": torch.randn(steps, batch, spec["sizes"][-1], generator=g)}
    vocab = spec["config"].get("vocab_size", 256)
    tokens = torch.randint(0, vocab, (steps, batch, seq_len + 1), generator=g)
    return {"x": tokens[..., :-1], "y": tokens[..., 1:]}


def reference_adamw_run(model_spec: dict, data: dict, steps: int, hyper: dict) -> dict:
    """Single-process torch.optim.AdamW on the full batches: the answer every stage must give."""
    model = build_model(model_spec)
    opt = torch.optim.AdamW(model.parameters(), **hyper)
    losses = []
    for s in range(steps):
        opt.zero_grad()
        loss = batch_loss(model, model_spec, data["x"][s], data["y"][s])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()}, "losses": losses}


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (None and freed ones hold nothing)."""
    return storage_bytes(t for t in tensors if t is not None)


def reachable_tensor_bytes(obj, exclude=(), max_depth: int = 8) -> int:
    """Bytes of the distinct tensor storages reachable from `obj` (through attributes, dicts,
    lists, tuples and sets), skipping the storages of the tensors in `exclude`: what an optimizer
    object holds besides the model's own parameters and gradients, however it stores it."""
    skip = {storage_key(t) for t in exclude if t is not None}
    found, visited = [], set()

    def walk(x, depth):
        if depth > max_depth or id(x) in visited:
            return
        visited.add(id(x))
        if isinstance(x, torch.Tensor):
            if storage_key(x) not in skip:
                found.append(x)
            return
        if isinstance(x, dict):
            for k, v in x.items():
                walk(k, depth + 1)
                walk(v, depth + 1)
        elif isinstance(x, (list, tuple, set, frozenset)):
            for v in x:
                walk(v, depth + 1)
        elif hasattr(x, "__dict__") and not isinstance(x, type) and not callable(x) or isinstance(x, torch.optim.Optimizer):
            for v in vars(x).values():
                walk(v, depth + 1)

    walk(obj, 0)
    return tensor_bytes(found)


def _global_loss(loss: torch.Tensor, world_size: int) -> float:
    total = loss.detach().float().reshape(1).clone()
    dist.all_reduce(total)   # bookkeeping, not training traffic: outside the per-step counts
    return total.item() / world_size


def _train(rank, world_size, model, opt, model_spec, data, steps, record_history, counter):
    """The training loop on one rank. `counter` is a count_bytes() open around the whole run
    (one context for all steps, read as differences per step)."""
    device = next(model.parameters()).device
    losses, sent, calls, history = [], [], [], []
    for s in range(steps):
        x, y = (data[k][s].chunk(world_size)[rank].to(device) for k in ("x", "y"))
        zero_grad = getattr(opt, "zero_grad", None)
        zero_grad() if callable(zero_grad) else model.zero_grad(set_to_none=True)
        sent_before, calls_before = counter.sent, Counter(counter.calls)
        loss = batch_loss(model, model_spec, x, y)
        loss.backward()
        opt.step()
        sent.append(counter.sent - sent_before)
        calls.append(dict(Counter(counter.calls) - calls_before))
        losses.append(_global_loss(loss, world_size))
        if record_history:
            history.append(_params(model, opt))
    return losses, sent, calls, history


def _params(model, opt) -> dict:
    full = getattr(opt, "full_parameters", None)
    if callable(full):
        return {n: t.float() for n, t in full().items()}
    return {n: p.detach().float().clone() for n, p in model.named_parameters()}


def quiet_rank() -> None:
    """No FutureWarning from torch 2.13's renaming of reduce_scatter_tensor /
    all_gather_into_tensor to *_single (a student's code may use the old names): a warning on a
    rank reaches the notebook's stderr, which fails a graded cell. (launch already gives each
    rank its share of the cores.)"""
    warnings.filterwarnings("ignore", message=r".*is deprecated\. Please use .*_single", category=FutureWarning)


def _zero_rank(rank, world_size, stage, model_spec, data, steps, hyper, ring, record_history):
    from .zero import ZeroAdamW
    from .zero_memory import zero_memory_held
    quiet_rank()
    model = build_model(model_spec)
    collectives = RingCollectives() if ring else TorchCollectives()
    opt = ZeroAdamW(model, stage, collectives=collectives, **hyper)
    with count_bytes() as counter:
        losses, sent, calls, history = _train(rank, world_size, model, opt, model_spec, data, steps,
                                              record_history, counter)
        held = zero_memory_held(opt)       # between two steps: what this rank keeps
        final = _params(model, opt)
    return {"params": final, "losses": losses, "bytes_sent": sent, "calls": calls,
            "memory": held, "history": history, "n_params": sum(p.numel() for p in model.parameters())}


def train_zero_on_ranks(stage: int, world_size: int, model_spec: dict, data: dict, steps: int,
                        hyper: dict | None = None, ring: bool = False, record_history: bool = False,
                        timeout: float = 120.0) -> dict:
    """Train `model_spec` with camplib's ZeroAdamW(stage) on `world_size` ranks for `steps` steps.
    `ring=True` runs the collectives on camplib's ring (slower) so that bytes_sent is what the
    rank really sent. Returns per-rank lists: "params" (final full parameters, fp32), "losses"
    (full-batch mean per step), "bytes_sent" (per step), "calls", "memory" (bytes held after the
    last step) and "history" (parameters after each step, if asked); and "n_params"."""
    ranks = launch(_zero_rank, world_size, stage, model_spec, data, steps, dict(hyper or {}), ring,
                   record_history, backend="gloo", timeout=timeout)
    out = {k: [r[k] for r in ranks] for k in ("params", "losses", "bytes_sent", "calls", "memory", "history")}
    out["n_params"] = ranks[0]["n_params"]
    return out


def _optimizer_rank(rank, world_size, optimizer_cls, model_spec, data, steps, hyper, average_gradients,
                    record_history):
    quiet_rank()
    model = build_model(model_spec)
    opt = optimizer_cls(model.parameters(), **hyper)
    if average_gradients:          # what DDP would do around an optimizer that expects averaged grads
        def average(param):
            dist.all_reduce(param.grad)
            param.grad.div_(world_size)
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(average)
    with count_bytes() as counter:
        losses, sent, calls, history = _train(rank, world_size, model, opt, model_spec, data, steps,
                                              record_history, counter)
        grads_held = tensor_bytes(p.grad for p in model.parameters())
        model_tensors = [t for p in model.parameters() for t in (p, p.grad)]
        state_held = reachable_tensor_bytes(opt, exclude=model_tensors)
        final = _params(model, opt)
    return {"params": final, "losses": losses, "bytes_sent": sent, "calls": calls,
            "history": history, "grad_bytes_held": grads_held, "state_bytes_held": state_held}


def train_optimizer_on_ranks(optimizer_cls, world_size: int, model_spec: dict, data: dict, steps: int,
                             hyper: dict | None = None, average_gradients: bool = False,
                             record_history: bool = False, timeout: float = 120.0) -> dict:
    """Train with `optimizer_cls(model.parameters(), **hyper)` on every rank: a ZeRO optimizer that
    does its own communication in step() (a student's Zero1AdamW, say), or, with
    `average_gradients=True`, one that expects DDP-averaged gradients (ZeroRedundancyOptimizer).
    Per step: zero_grad (the optimizer's, else the model's), forward, backward, step().
    Returns per-rank "params", "losses", "bytes_sent", "calls" (torch.distributed calls per step),
    "history", "grad_bytes_held" (bytes of .grad left in the model after the last step) and
    "state_bytes_held" (bytes the optimizer object holds besides the model's parameters and
    gradients: master weights and moments, sharded or not)."""
    ranks = launch(_optimizer_rank, world_size, optimizer_cls, model_spec, data, steps, dict(hyper or {}),
                   average_gradients, record_history, backend="gloo", timeout=timeout)
    return {k: [r[k] for r in ranks] for k in ("params", "losses", "bytes_sent", "calls", "history",
                                                "grad_bytes_held", "state_bytes_held")}


def _shard_rank(rank, world_size, fn, model_spec, data):
    quiet_rank()
    model = build_model(model_spec)
    x, y = (data[k][0].chunk(world_size)[rank] for k in ("x", "y"))
    batch_loss(model, model_spec, x, y).backward()
    with count_bytes() as counter:
        shard = fn(list(model.parameters()))
    left = [n for n, p in model.named_parameters() if p.grad is not None]
    return {"shard": shard, "grads_left": left, "calls": dict(counter.calls)}


def gradient_shards_on_ranks(fn, world_size: int, model_spec: dict, data: dict, timeout: float = 60.0) -> dict:
    """One backward on every rank (its rows of batch 0), then `fn(params)`: a ZeRO-2 gradient
    reduce-scatter that returns this rank's shard of the averaged flat gradient. Returns per-rank
    "shards", "grads_left" (names of parameters whose .grad fn did not free) and "calls"."""
    ranks = launch(_shard_rank, world_size, fn, model_spec, data, backend="gloo", timeout=timeout)
    return {"shards": [r["shard"] for r in ranks], "grads_left": [r["grads_left"] for r in ranks],
            "calls": [r["calls"] for r in ranks]}
