"""ZeRO training on N ranks, seen from the outside: final parameters, losses, bytes held and
bytes sent. What the tests, the benchmark and lab a02's graded cells use. Each runner is a rank
function plus one call of camplib.dist.on_ranks, so results are one format: {key: [value per
rank]} plus "bytes_sent" and "calls" (the whole run, per rank); per-step numbers come as
"bytes_per_step" and "calls_per_step". camplib.parallel.zero.optimizer never imports this module.

Models are built inside each rank from a plain spec (camplib.parallel.model_specs), so only
dicts and tensors cross processes. Data is camplib.parallel.reference's format,
{"x": (steps, B, ...), "y": (steps, B, ...)}: rank r trains on rows chunk(N)[r] of batch s.
The ranks' models live on the CPU and talk over gloo (one GPU cannot host several NCCL ranks).
camplib's own ZeroAdamW (and its ring and memory accounting) is imported only by the runner that
trains it: lab a02's tests hand the student's optimizer to the others, and a lab's sandbox
leaves out the modules the lab forbids (autograder.isolation.course_tree).

The grader runs a02's tests on ranks it starts itself (autograder.checks.separate_ranks), each
holding only its own rows of every batch: `optimizer_inputs` / `optimizer_rank` and
`shard_inputs` / `shard_rank`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from camplib.dist.counting import count_bytes
from camplib.dist.ranks import on_ranks
from camplib.dist.separate import run_through
from camplib.memory import storage_bytes, storage_key

from camplib.parallel.model_specs import batch_loss, build_model
from camplib.parallel.reference import make_data

__all__ = ["build_model", "batch_loss", "make_data", "train_zero_on_ranks", "train_optimizer_on_ranks",
           "gradient_shards_on_ranks", "tensor_bytes", "reachable_tensor_bytes", "optimizer_inputs", "optimizer_rank",
           "shard_inputs", "shard_rank"]

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


def _own_rows(data: dict, rank: int, world_size: int) -> dict:
    """Rank `rank`'s rows of every batch of `data` (reference's format, steps first)."""
    return {k: torch.stack([batch.chunk(world_size)[rank] for batch in data[k]]) for k in ("x", "y")}


def _train(rank, world_size, model, opt, model_spec, data, steps, record_history, own_rows=False, pause=False):
    """The training loop on one rank: per step zero_grad (the optimizer's, else the model's),
    forward, backward, step(), with the bytes sent and the calls made in them counted. `own_rows`:
    `data` holds this rank's rows only (`_own_rows`), else every rank's. A generator returning the
    dict (`run_through` runs it to its end), which pauses after every step if asked (`pause`)."""
    device = next(model.parameters()).device
    out = {"losses": [], "bytes_per_step": [], "calls_per_step": [], "history": []}
    for s in range(steps):
        x, y = (data[k][s] if own_rows else data[k][s].chunk(world_size)[rank] for k in ("x", "y"))
        x, y = x.to(device), y.to(device)
        zero_grad = getattr(opt, "zero_grad", None)
        zero_grad() if callable(zero_grad) else model.zero_grad(set_to_none=True)
        with count_bytes() as step:
            loss = batch_loss(model, model_spec, x, y)
            loss.backward()
            opt.step()
        out["bytes_per_step"].append(step.sent)
        out["calls_per_step"].append(dict(step.calls))
        out["losses"].append(_global_loss(loss, world_size))
        if record_history:
            out["history"].append(_params(model, opt))
        if pause:
            yield
    return out


def _params(model, opt) -> dict:
    """name -> full parameter, in fp32 or wider (bf16 weights come back as fp32, fp64 stay fp64)."""
    full = getattr(opt, "full_parameters", None)
    named = full().items() if callable(full) else ((n, p.detach().clone()) for n, p in model.named_parameters())
    return {n: t.to(torch.promote_types(t.dtype, torch.float32)) for n, t in named}


def _watch_gradient_bytes(model, tensors_held) -> dict:
    """{"peak": bytes}: the most bytes of gradients held at once, measured from outside the
    optimizer. A hook on every parameter, registered BEFORE the optimizer's own (hooks run in
    order), adds up the distinct storages of every .grad and of `tensors_held()` (the
    optimizer's gradient buffers) right after each gradient is accumulated, i.e. before the
    optimizer can reduce and free it. (A transient flat copy inside a reduce-scatter is not seen.)"""
    seen = {"peak": 0}
    params = list(model.parameters())

    def measure(_param):
        held = storage_bytes([p.grad for p in params if p.grad is not None] + list(tensors_held()))
        seen["peak"] = max(seen["peak"], held)

    for p in params:
        p.register_post_accumulate_grad_hook(measure)
    return seen


def _zero_rank(rank, world_size, stage, model_spec, data, steps, hyper, ring, record_history):
    from camplib.dist.ring import RingCollectives, TorchCollectives

    from camplib.parallel.zero.optimizer import ZeroAdamW
    from camplib.parallel.zero.memory import zero_memory_held
    model = build_model(model_spec)
    collectives = RingCollectives() if ring else TorchCollectives()
    opt = None
    peak = _watch_gradient_bytes(model, lambda: (opt.grad_full or []) + (opt.grad_shards or []))
    opt = ZeroAdamW(model, stage, collectives=collectives, **hyper)
    out = run_through(_train(rank, world_size, model, opt, model_spec, data, steps, record_history))
    out["memory"] = zero_memory_held(opt)       # between two steps: what this rank keeps
    out["peak_grad_bytes"] = max(peak["peak"], out["memory"]["grads"])
    out["master_dtypes"] = sorted({str(m.dtype).removeprefix("torch.") for m in opt.masters})
    out["params"] = _params(model, opt)
    out["n_params"] = sum(p.numel() for p in model.parameters())
    return out


def train_zero_on_ranks(stage: int, world_size: int, model_spec: dict, data: dict, steps: int,
                        hyper: dict | None = None, ring: bool = False, record_history: bool = False,
                        timeout: float = 120.0) -> dict:
    """Train `model_spec` with camplib's ZeroAdamW(stage) on `world_size` ranks for `steps` steps.
    `ring=True` runs the collectives on camplib's ring (slower) so that the bytes counted are
    what the rank really sent. Returns on_ranks' format, one entry per rank: "params" (final full
    parameters, fp32), "losses" (full-batch mean per step), "bytes_per_step", "calls_per_step",
    "memory" (bytes held after the last step, camplib.parallel.zero.memory), "peak_grad_bytes"
    (the most bytes of gradients held at once, backward included, measured from outside the
    optimizer), "master_dtypes" (of the optimizer's master weights), "history" (parameters
    after each step, if asked), "n_params", "bytes_sent" and "calls". `hyper` goes to ZeroAdamW
    (optimizer_class, master_dtype, bucket_mb, and the optimizer's lr, betas, weight_decay...)."""
    return on_ranks(_zero_rank, world_size, stage, model_spec, data, steps, dict(hyper or {}), ring,
                    record_history, backend="gloo", timeout=timeout)


def _optimizer_rank(rank, world_size, optimizer_cls, model_spec, data, steps, hyper, average_gradients,
                    record_history, own_rows=False):
    return run_through(_optimizer_run(rank, world_size, optimizer_cls, model_spec, data, steps, hyper, average_gradients,
                                      record_history, own_rows))


def _warm_up() -> None:
    """What a rank's first optimizer step and backward import and allocate once (torch._dynamo
    behind every torch.optim constructor, autograd's engine), done before a pause that measures
    a baseline, so that what is held later is the optimizer's own."""
    p = torch.zeros(2, requires_grad=True)
    opt = torch.optim.AdamW([p])
    (p * 2).sum().backward()
    opt.step()


def _optimizer_run(rank, world_size, optimizer_cls, model_spec, data, steps, hyper, average_gradients,
                   record_history, own_rows=False, pause=False):
    """`_optimizer_rank` as a generator; with `pause`, it pauses (camplib.dist.separate) once the
    model is built, before the optimizer is, and after every step: what a rank keeps between steps
    can be measured."""
    model = build_model(model_spec)
    if pause:
        _warm_up()
        yield
    opt = optimizer_cls(model.parameters(), **hyper)
    if average_gradients:          # what DDP would do around an optimizer that expects averaged grads
        def average(param):
            dist.all_reduce(param.grad)
            param.grad.div_(world_size)
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(average)
    out = yield from _train(rank, world_size, model, opt, model_spec, data, steps, record_history, own_rows, pause)
    out["grad_bytes_held"] = tensor_bytes(p.grad for p in model.parameters())
    model_tensors = [t for p in model.parameters() for t in (p, p.grad)]
    out["state_bytes_held"] = reachable_tensor_bytes(opt, exclude=model_tensors)
    out["params"] = _params(model, opt)
    return out


def train_optimizer_on_ranks(optimizer_cls, world_size: int, model_spec: dict, data: dict, steps: int,
                             hyper: dict | None = None, average_gradients: bool = False,
                             record_history: bool = False, timeout: float = 120.0) -> dict:
    """Train with `optimizer_cls(model.parameters(), **hyper)` on every rank: a ZeRO optimizer that
    does its own communication in step() (a student's Zero1AdamW, say), or, with
    `average_gradients=True`, one that expects DDP-averaged gradients (ZeroRedundancyOptimizer).
    Returns on_ranks' format, one entry per rank: "params", "losses", "bytes_per_step",
    "calls_per_step", "history", "grad_bytes_held" (bytes of .grad left in the model after the
    last step), "state_bytes_held" (bytes the optimizer object holds besides the model's
    parameters and gradients: master weights and moments, sharded or not), "bytes_sent", "calls"."""
    return on_ranks(_optimizer_rank, world_size, optimizer_cls, model_spec, data, steps, dict(hyper or {}),
                    average_gradients, record_history, backend="gloo", timeout=timeout)


def optimizer_inputs(world_size: int, model_spec: dict, data: dict, steps: int, hyper: dict | None = None,
                     average_gradients: bool = False, record_history: bool = False, timeout: float = 120.0,
                     pause: bool = False) -> list[dict]:
    """What `optimizer_rank` gets on each rank for `train_optimizer_on_ranks`' run: the spec and
    the rank's own rows of every batch, nothing of another rank's rows. `pause`: the ranks pause
    before the optimizer exists and after every step (what they hold there is measured)."""
    return [{"spec": dict(model_spec), "data": _own_rows(data, rank, world_size), "steps": steps,
             "hyper": dict(hyper or {}), "average_gradients": average_gradients, "record_history": record_history,
             "pause": pause} for rank in range(world_size)]


def optimizer_rank(rank: int, world_size: int, optimizer_cls, mine: dict):
    """One rank of `train_optimizer_on_ranks` holding only its `optimizer_inputs`: what
    autograder.checks.separate_ranks hands each rank. Asked to (`optimizer_inputs(pause=True)`) it
    pauses once the model is built (before the optimizer is) and after every step, where
    separate_ranks measures what the rank holds ("resident_bytes"): ZeRO-1's optimizer keeps the
    state of its shard only."""
    return (yield from _optimizer_run(rank, world_size, optimizer_cls, mine["spec"], mine["data"], mine["steps"],
                                      mine["hyper"], mine["average_gradients"], mine["record_history"], own_rows=True,
                                      pause=mine.get("pause", False)))


def _shard_rank(rank, world_size, fn, model_spec, data):
    return run_through(shard_rank(rank, world_size, fn, {"spec": model_spec, "data": _own_rows(data, rank, world_size)}))


def shard_inputs(world_size: int, model_spec: dict, data: dict, pause: bool = False) -> list[dict]:
    """What `shard_rank` gets on each rank: the spec and the rank's own rows of batch 0. `pause`:
    the ranks pause before the backward and after `fn` (what they hold there is measured)."""
    return [{"spec": dict(model_spec), "data": _own_rows({k: data[k][:1] for k in ("x", "y")}, rank, world_size),
             "pause": pause} for rank in range(world_size)]


def shard_rank(rank: int, world_size: int, fn, mine: dict):
    """One rank of `gradient_shards_on_ranks` holding only its `shard_inputs`: one backward on its
    rows, then `fn(params)`. Asked to (`shard_inputs(pause=True)`) it pauses before the backward
    and after `fn` (the shard it returned held), where separate_ranks measures what the rank holds
    ("resident_bytes"): ZeRO-2 keeps the shard, not the full gradients."""
    model_spec = mine["spec"]
    model = build_model(model_spec)
    x, y = mine["data"]["x"][0], mine["data"]["y"][0]
    if mine.get("pause"):
        _warm_up()
        yield
    batch_loss(model, model_spec, x, y).backward()     # no communication: "calls" are fn's
    shard = fn(list(model.parameters()))
    if mine.get("pause"):
        yield
    return {"shards": shard, "grads_left": [n for n, p in model.named_parameters() if p.grad is not None]}


def gradient_shards_on_ranks(fn, world_size: int, model_spec: dict, data: dict, timeout: float = 60.0) -> dict:
    """One backward on every rank (its rows of batch 0), then `fn(params)`: a ZeRO-2 gradient
    reduce-scatter that returns this rank's shard of the averaged flat gradient. Returns on_ranks'
    format: per-rank "shards", "grads_left" (names of parameters whose .grad fn did not free),
    "calls" and "bytes_sent"."""
    return on_ranks(_shard_rank, world_size, fn, model_spec, data, backend="gloo", timeout=timeout)
