"""What lab p03's tests run next to a student's classes: camplib's `Engine` with their block
manager and/or scheduler plugged in (the library's own where one is not given), requests that
arrive at chosen steps (and clients that leave at chosen steps), and a record of every step as
plain data: who was in the batch, who got a token, KV blocks in use.

A graded test calls it through `make("camplib.serving.harness.run_requests", ...)`, handing over
the student's class, so during grading it runs in the student's process and only the record
comes back; the test compares it with `camplib.generate.generate` run in the grader's own process
on the same weights. The lab forbids `camplib.serving.block_manager` and `.scheduler` by name;
this runner lives outside them (a forbidden module's functions are wrapped by the grader).
"""
from __future__ import annotations

import torch

from camplib.model import GPT, GPTConfig
from camplib.serving.block_manager import BlockManager
from camplib.serving.engine import Engine
from camplib.serving.scheduler import Scheduler
from camplib.serving.sequence import SamplingParams

__all__ = ["run_requests", "model_from"]


def model_from(config: dict, params: dict[str, torch.Tensor], device=None) -> GPT:
    """A GPT with exactly these parameters (`named_parameters()` names, as
    `autograder.checks.parameters_of` gives them: tied weights once), in their dtype, on `device`."""
    model = GPT(GPTConfig(**config))
    named = dict(model.named_parameters())
    if set(params) != set(named):
        raise ValueError(f"parameters do not match GPTConfig({config}): missing {sorted(set(named) - set(params))}, "
                         f"unexpected {sorted(set(params) - set(named))}")
    model = model.to(device=device, dtype=next(iter(params.values())).dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])
    return model.eval()


def run_requests(config: dict, params: dict[str, torch.Tensor], requests: list[dict], *,
                 block_manager=None, scheduler=None, block_size: int = 4, num_blocks: int = 64,
                 max_batch: int = 4, max_step_tokens: int = 4096, max_steps: int = 2000, device=None) -> dict:
    """Serve `requests` with continuous batching, one engine step at a time.

    Each request is {"prompt": [ids], "max_tokens": n, "arrival": step (default 0),
    "abort_at": step or None (its client disconnects before that step)}. A request that arrives
    at step s is added just before step s runs. The step's token budget (max_step_tokens) is large
    by default, so an admission waits only for room in the batch and for KV blocks; a small one
    cuts prompts into chunks (a request then gets its first token the step its last chunk runs). Returns plain data:
      outputs, finish_reasons, preemptions, first_token_step (the step that gave each request its
      first token; None if it never got one), blocks_in_use_end, num_blocks, and
      steps: one dict per step {"running": request indices in the batch after the step,
      "got_token": request indices that got a token, "computed": {index: tokens of it the step
      ran through the model}, "blocks_in_use": after the step, "lengths": {index: tokens with a
      KV slot} of the running requests}.
    """
    if max_step_tokens < max_batch:
        raise ValueError(f"max_step_tokens {max_step_tokens} < max_batch {max_batch}: every decoding sequence "
                         f"gets its token each step only if the budget has room for all of them")
    model = model_from(config, params, device)
    engine = Engine(model, block_size=block_size, num_blocks=num_blocks, max_batch=max_batch,
                    max_step_tokens=max_step_tokens, scheduler_cls=scheduler or Scheduler,
                    block_manager_cls=block_manager or BlockManager)
    arrivals = sorted(range(len(requests)), key=lambda i: (int(requests[i].get("arrival", 0)), i))
    seqs: list = [None] * len(requests)
    index_of: dict[int, int] = {}
    first_token_step: list = [None] * len(requests)
    steps: list[dict] = []
    step = 0
    while arrivals or engine.has_work():
        if step >= max_steps:
            raise RuntimeError(f"not finished after {max_steps} steps: {len(engine.scheduler.waiting)} waiting, "
                               f"{len(engine.scheduler.running)} running")
        while arrivals and int(requests[arrivals[0]].get("arrival", 0)) <= step:
            i = arrivals.pop(0)
            r = requests[i]
            seqs[i] = engine.add(list(r["prompt"]), SamplingParams(max_tokens=int(r["max_tokens"])))
            index_of[seqs[i].id] = i
        for i, r in enumerate(requests):
            if r.get("abort_at") is not None and int(r["abort_at"]) == step and seqs[i] is not None:
                engine.abort(seqs[i])
        before = {i: (s.num_cached, s.preemptions) for i, s in enumerate(seqs) if s is not None}
        got = engine.step() if engine.has_work() else []
        got_idx = sorted(index_of[s.id] for s in got)
        computed = {}
        for i, (cached, preemptions) in before.items():   # a sequence preempted this step restarted from 0
            n = seqs[i].num_cached - (cached if seqs[i].preemptions == preemptions else 0)
            if n > 0:
                computed[str(i)] = n
        for i in got_idx:
            if first_token_step[i] is None:
                first_token_step[i] = step
        running = [index_of[s.id] for s in engine.scheduler.running]
        steps.append({"running": sorted(running), "got_token": got_idx, "computed": computed,
                      "blocks_in_use": int(engine.blocks.blocks_in_use),
                      # a running sequence that got a token has a KV slot for every token but that
                      # one; one that did not is mid-prefill, with slots for its whole prompt
                      "lengths": {str(i): len(seqs[i]) - (i in got_idx) for i in running}})
        step += 1
    return {"outputs": [list(s.output) for s in seqs], "finish_reasons": [s.finish_reason for s in seqs],
            "preemptions": [int(s.preemptions) for s in seqs], "first_token_step": first_token_step,
            "blocks_in_use_end": int(engine.blocks.blocks_in_use), "num_blocks": int(num_blocks),
            "steps": steps}
