"""Run camplib's GPT as a pipeline on p ranks and bring back plain data: what tests, benchmarks
and lab a04's grader compare with the single-process model. A runner: a rank function plus one
call of camplib.dist.on_ranks (pipeline.stages / pipeline.comm never import it).

    out = run_pipeline(gpt, idx, targets, p=2, m=4, schedule="1f1b")
    out["loss"], out["grads"]        # the whole batch's loss, {dense name: gradient}
    out["peak_in_flight"]            # per rank, measured
    out["events"]                    # per rank: [(action, start, end)] seconds from the last step's
                                     # first action on any rank (the course's step only)

`schedule` is a name of `camplib.parallel.pipeline.schedule.SCHEDULES` or an explicit list of
per-rank action lists; `step_fn` replaces `camplib.parallel.pipeline.stages.pipeline_step` (a student's).
Every size and the schedule itself are checked here, before any rank starts.
"""
from __future__ import annotations

import torch
import torch.fx.experimental.symbolic_shapes  # noqa: F401  see below
from torch import nn

from camplib.dist import on_ranks
from camplib.parallel.pipeline.stages import InFlight, check_pipeline, pipeline_step, stages_of_rank
from camplib.parallel.pipeline.comm import PipelineComm, sum_tied_grad
from camplib.parallel.model_specs import build_model, model_with_weights
from camplib.parallel.pipeline.schedule import as_actions, build_schedule, check_schedule

__all__ = ["join_pipeline", "pipeline_inputs", "pipeline_rank", "pipeline_spec_rank", "run_pipeline",
           "run_pipeline_spec"]

# `tensor.backward(gradient)` imports torch.fx.experimental.symbolic_shapes (and sympy) the first
# time it runs in a process: 2-3 s on every forked rank of every run. Imported here, in the
# launching process, the ranks inherit it.


def pipeline_rank(rank: int, p: int, gpt: nn.Module, idx: torch.Tensor, targets: torch.Tensor, m: int, v: int,
                  schedule: list, step_fn, timeout: float, steps: int = 1) -> dict:
    """A rank function: build this rank's stages of `gpt` (reached by fork), run `step_fn` on its
    actions `steps` times (gradients of the last step), sum a tied embedding's gradient between
    the first and last stage, and return the loss, gradients by dense name, peak and events."""
    in_flight = InFlight()
    stages = stages_of_rank(gpt, rank, p, v, in_flight)
    shape = (idx.size(0) // m, idx.size(1), gpt.config.d_model)
    micro_batches = list(zip(idx.chunk(m), targets.chunk(m)))
    params = {n: q for s in stages.values() for n, q in s.named_parameters()}
    events, loss = [], None
    for _ in range(steps):
        for q in params.values():
            q.grad = None
        comm = PipelineComm(rank, p, p * v, shape, gpt.tok_emb.weight.dtype, timeout)
        events = []   # only the course's step records them (perf_counter: one clock for all local ranks)
        loss = step_fn(stages, schedule[rank], micro_batches, comm, events) if step_fn is pipeline_step \
            else step_fn(stages, schedule[rank], micro_batches, comm)
    if gpt.lm_head.weight is gpt.tok_emb.weight:
        sum_tied_grad(gpt.tok_emb.weight, rank, first=0, last=(p * v - 1) % p, timeout=timeout)
    grads = {n: (q.grad.clone() if q.grad is not None else None) for n, q in params.items()}
    if "lm_head.weight" in grads and gpt.lm_head.weight is gpt.tok_emb.weight:
        grads["tok_emb.weight"] = grads.pop("lm_head.weight")   # the dense model's name of the tied weight
    return {"loss": torch.as_tensor(loss).detach().reshape(()), "grads": grads, "peak": in_flight.peak,
            "events": [(tuple(a), s, e) for a, s, e in events]}


def run_pipeline(gpt: nn.Module, idx: torch.Tensor, targets: torch.Tensor, p: int, m: int, v: int = 1,
                 schedule: str | list = "1f1b", step_fn=None, *, steps: int = 1, timeout: float = 60.0) -> dict:
    """Run one training step (or `steps`) of `gpt` on (idx, targets) as a p-rank pipeline with m
    micro-batches and v chunks per rank. Returns {"loss" (the last stage's), "losses" (per rank:
    the last stage's rank holds the loss, the others 0), "grads" {dense name: gradient},
    "peak_in_flight" per rank, "events" per rank, "bytes_sent" per rank}."""
    check_pipeline(gpt.config.n_layer, idx.size(0), p, m, v)
    if isinstance(schedule, str):
        schedule = build_schedule(schedule, p, m, v)
    if not isinstance(schedule, list) or len(schedule) != p:
        raise ValueError(f"a schedule is a list of {p} per-rank action lists, got {type(schedule).__name__} "
                         f"of length {len(schedule) if hasattr(schedule, '__len__') else '?'}")
    check_schedule(schedule, m, v)
    schedule = as_actions(schedule)
    out = on_ranks(pipeline_rank, p, gpt, idx, targets, m, v, schedule, step_fn or pipeline_step, timeout, steps,
                   timeout=timeout)
    return join_pipeline(out, p, v)


def join_pipeline(out: dict, p: int, v: int) -> dict:
    """run_pipeline's result from on_ranks' format of pipeline_rank's."""
    starts = [start for ev in out["events"] for _, start, _ in ev]
    t0 = min(starts) if starts else 0.0   # the step's first action on any rank
    events = [[(a, start - t0, end - t0) for a, start, end in ev] for ev in out["events"]]
    grads = {}
    for rank_grads in out["grads"]:
        for name, g in rank_grads.items():
            grads.setdefault(name, g)        # a tied weight: both ranks hold the same sum
    last = (p * v - 1) % p
    return {"loss": out["loss"][last], "losses": out["loss"], "grads": grads, "peak_in_flight": out["peak"],
            "events": events, "bytes_sent": out["bytes_sent"]}


def run_pipeline_spec(spec: dict, idx: torch.Tensor, targets: torch.Tensor, p: int, m: int, v: int = 1,
                      schedule: str | list = "1f1b", step_fn=None, *, timeout: float = 60.0) -> dict:
    """`run_pipeline` on `build_model(spec)` (camplib.parallel.model_specs: plain data, so a grader
    can hand it across a process boundary), returning only plain data: "loss", "grads",
    "peak_in_flight", "bytes_sent"."""
    out = run_pipeline(build_model(spec), idx, targets, p, m, v, schedule, step_fn, timeout=timeout)
    return {k: out[k] for k in ("loss", "grads", "peak_in_flight", "bytes_sent")}


def pipeline_inputs(spec: dict, idx: torch.Tensor, targets: torch.Tensor, p: int, m: int, v: int,
                    schedule: list, timeout: float = 20.0) -> list[dict]:
    """What `pipeline_spec_rank` gets on each of p ranks: the model's weights with every parameter
    of another rank's stages set to NaN, the token ids only where the first stage lives and the
    targets only where the last one does (random ids elsewhere, same shapes). A rank holds only
    its own stages: a loss or gradient it computes without the others is wrong, while a pipeline
    never reads another stage's weights or another stage's inputs. The spec goes without its
    "seed": a rank builds any model of that shape and loads its weights, and cannot rebuild the
    other stages' weights from the seed."""
    gpt = build_model(spec)
    check_pipeline(gpt.config.n_layer, idx.size(0), p, m, v)
    check_schedule(schedule, m, v)
    state = gpt.state_dict(keep_vars=True)
    g = torch.Generator().manual_seed(0)
    shape_only = {k: v for k, v in spec.items() if k != "seed"}
    ranks = []
    for rank in range(p):
        stages = stages_of_rank(gpt, rank, p, v)
        owned = {id(q) for s in stages.values() for q in s.parameters()}
        mine = {n: (t.detach().clone() if id(t) in owned or not t.is_floating_point()
                    else torch.full_like(t.detach(), float("nan"))) for n, t in state.items()}
        first = any(s.is_first for s in stages.values())
        last = any(s.is_last for s in stages.values())
        ranks.append({"spec": shape_only, "state": mine, "m": m, "v": v, "schedule": schedule, "timeout": timeout,
                      "idx": idx if first else torch.randint(0, gpt.config.vocab_size, idx.shape, generator=g),
                      "targets": targets if last else torch.randint(0, gpt.config.vocab_size, targets.shape,
                                                                    generator=g)})
    return ranks


def pipeline_spec_rank(rank: int, p: int, step_fn, mine: dict) -> dict:
    """One rank of a pipeline step on this rank's own `pipeline_inputs` (what
    autograder.checks.separate_ranks hands each rank)."""
    gpt = model_with_weights(mine["spec"], mine["state"])
    return pipeline_rank(rank, p, gpt, mine["idx"], mine["targets"], mine["m"], mine["v"],
                         as_actions(mine["schedule"]), step_fn, mine["timeout"])
