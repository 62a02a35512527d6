"""A model that knows the answers, to grade a single-line infilling function by execution in seconds.

A test of `fill_line(model, bpe, prefix, suffix)` (p01) needs a model whose right answers pass
HumanEval's tests: a small model trained on the stdlib for seconds passes almost none, so any
fill_line, right or wrong, would score the same. This one is a tiny camplib GPT trained to
memorise the single-line infilling tasks of POOL (seven short HumanEval problems, 8 tasks) in
the FIM format (PSM: `<|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|> line
<|endoftext|>`, one example per task, each in a row of its own), with a ByteBPE trained on those
problems. A function that builds that prompt, decodes greedily and stops at the end of the line
gets the line back and its program passes; one that orders the sentinels wrongly, ignores the
suffix or keeps writing past the newline gets something else, which fails.

`memorized_infiller()` returns plain data (config, weights, tokenizer merges and specials,
tasks), computed once per process; the test builds the model where the student's code runs.
A runner: no library module imports it.
"""
from __future__ import annotations

from dataclasses import asdict
from functools import lru_cache

import torch

from camplib.codegen.humaneval import infilling_tasks, load_problems
from camplib.codegen.sentinels import EOT, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, SPECIAL_TOKENS
from camplib.model import GPT, GPTConfig
from camplib.tokenizer import ByteBPE

__all__ = ["POOL", "memorized_infiller"]

POOL = ("HumanEval/23", "HumanEval/27", "HumanEval/34", "HumanEval/45", "HumanEval/53", "HumanEval/83",
        "HumanEval/85")   # the seven shortest problems (prompt + solution), 8 lines


@lru_cache(maxsize=2)
def memorized_infiller(steps: int = 140, seed: int = 0) -> dict:
    problems = [p for p in load_problems() if p.task_id in POOL]
    tasks = infilling_tasks(problems)
    bpe = ByteBPE.train([p.prompt + p.canonical_solution for p in problems], 384, special_tokens=SPECIAL_TOKENS)
    eot = bpe.special_tokens[EOT]
    rows = [bpe.encode(f"{FIM_PREFIX}{t.prefix}{FIM_SUFFIX}{t.suffix}{FIM_MIDDLE}{t.middle}\n", allow_special=True)
            + [eot] for t in tasks]
    length = max(map(len, rows))
    batch = torch.full((len(rows), length), eot)
    for i, r in enumerate(rows):
        batch[i, :len(r)] = torch.tensor(r)
    targets = batch[:, 1:].clone()
    targets[batch[:, 1:] == eot] = -100
    targets[torch.arange(len(rows)), torch.tensor([len(r) - 2 for r in rows])] = eot   # the end of text counts once
    torch.manual_seed(seed)
    config = GPTConfig.llama_style(vocab_size=bpe.vocab_size, d_model=64, n_layer=2, n_head=4, n_kv_head=2,
                                   max_seq_len=length + 64)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        _, loss = model(batch[:, :-1], targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {"config": asdict(config), "weights": {k: v.detach().clone() for k, v in model.named_parameters()},
            "merges": [list(m) for m in bpe.merges], "special_tokens": list(SPECIAL_TOKENS),
            "tasks": [asdict(t) for t in tasks], "final_loss": float(loss.detach())}
