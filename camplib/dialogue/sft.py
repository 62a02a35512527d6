"""Supervised fine-tuning with LoRA on chat examples (camplib.lora on camplib's GPT).

`lora_sft` adapts a copy-free model in place: camplib.lora.inject_lora freezes every weight and
wraps the target Linears, then AdamW (camplib.optim.PlainAdamW) trains only the LoRA matrices on batches of
{"input_ids", "labels"} with a masked loss (camplib.dialogue.masking.masked_cross_entropy, or a
student's). The batches are right-padded, so the model needs no attention mask: padding only
comes after the real tokens, which a causal model never lets them see.

`sft_for_grading` is the same run for a lab's outcome test: plain data in (the base's config and
weights, the batches as tensors), plain data out (the losses and the trained LoRA tensors), so a
grader can run a student's loss function where the student's code lives and evaluate the
result itself. The run is deterministic, so it is remembered per process for the same loss
function object and the same inputs (a digest of every tensor and setting): the notebook's
demonstration and its test then train once, not twice.
"""
from __future__ import annotations

import hashlib
import json
import weakref
from typing import Callable, Sequence

import torch

from camplib.lora import inject_lora, lora_modules
from camplib.model import GPT, GPTConfig
from camplib.optim import PlainAdamW

__all__ = ["TARGETS", "batches_of", "lora_sft", "lora_tensors", "sft_for_grading", "load_lora"]

TARGETS = ["qkv", "proj", "gate", "up", "down"]     # every Linear of a Llama-style block


def batches_of(data: dict[str, torch.Tensor], batch_size: int, steps: int, seed: int) -> list[dict]:
    """`steps` batches of rows drawn from padded data (epochs reshuffled with a seeded
    generator), each cut to its longest row."""
    n = data["input_ids"].shape[0]
    gen = torch.Generator().manual_seed(seed)
    order, out = torch.empty(0, dtype=torch.long), []
    while len(out) < steps:
        if len(order) < batch_size:
            order = torch.cat([order, torch.randperm(n, generator=gen)])
        rows, order = order[:batch_size], order[batch_size:]
        length = int(data["attention_mask"][rows].sum(1).max())
        out.append({k: v[rows, :length] for k, v in data.items()})
    return out


def lora_sft(model: torch.nn.Module, batches: Sequence[dict], loss_fn: Callable, *, lr: float = 3e-3,
             r: int = 8, alpha: float = 16.0, targets=TARGETS, seed: int = 0,
             autocast_dtype: torch.dtype | None = None, train_embeddings: bool = False,
             on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """Inject LoRA into `model` (in place) and train it on `batches`; returns each step's loss.
    `loss_fn(logits, labels)` gets the full-sequence logits and unshifted labels.

    train_embeddings also trains the token embeddings (tied to the output layer in the tiny
    model), as peft's `modules_to_save=["embed_tokens"]`: a base that never saw the chat tokens
    (or the assistant's words) cannot learn them through LoRA on the Linears alone.

    on_step(step, loss), when given, is called after each step (1-based): to log or to save the
    adapter at several budgets of one run."""
    torch.manual_seed(seed)
    inject_lora(model, targets, r=r, alpha=alpha)
    if train_embeddings:
        model.tok_emb.weight.requires_grad_(True)
    optimizer = PlainAdamW([p for p in model.parameters() if p.requires_grad], lr)   # no torch.optim.Optimizer: no compiler-stack import per sandbox
    device = next(model.parameters()).device
    model.train()
    losses = []
    for batch in batches:
        x, y = batch["input_ids"].to(device), batch["labels"].to(device)
        if autocast_dtype is not None:
            with torch.autocast(device.type, dtype=autocast_dtype):
                logits = model(x)[0]
        else:
            logits = model(x)[0]
        loss = loss_fn(logits.float(), y)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"the loss is {float(loss)} at step {len(losses)}")
        losses.append(optimizer.minimize_step(loss, max_norm=1.0))
        if on_step is not None:
            model.eval()
            on_step(len(losses), losses[-1])
            model.train()
    model.eval()
    return losses


def lora_tensors(model: torch.nn.Module, train_embeddings: bool = False) -> dict[str, torch.Tensor]:
    """The trained tensors of a LoRA-tuned model, copied to the CPU, in `load_lora`'s format:
    "<module>.lora_A", "<module>.lora_B", and "tok_emb.weight" when the embeddings were trained."""
    lora = {"tok_emb.weight": model.tok_emb.weight.detach().cpu().clone()} if train_embeddings else {}
    for name, m in lora_modules(model).items():
        lora[f"{name}.lora_A"] = m.lora_A.detach().cpu().clone()
        lora[f"{name}.lora_B"] = m.lora_B.detach().cpu().clone()
    return lora


_RUNS: "weakref.WeakKeyDictionary[Callable, dict[str, dict]]" = weakref.WeakKeyDictionary()


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, dict):
            for k in sorted(part):
                h.update(k.encode())
                v = part[k]
                h.update(v.detach().cpu().contiguous().numpy().tobytes() if isinstance(v, torch.Tensor)
                         else json.dumps(v, sort_keys=True, default=str).encode())
        else:
            h.update(json.dumps(part, sort_keys=True, default=str).encode())
    return h.hexdigest()


def sft_for_grading(loss_fn: Callable, config: dict, state: dict, data: dict, *, steps: int, batch_size: int,
                    lr: float, r: int, alpha: float, seed: int, train_embeddings: bool = False,
                    device: str = "cpu") -> dict:
    """Build GPT(config) with `state`, LoRA-train it with loss_fn on `data` (padded tensors);
    {"losses": [...], "lora": {"<module>.lora_A": A, "<module>.lora_B": B, and "tok_emb.weight"
    when the embeddings were trained}}: plain data for the grader's `load_lora`."""
    settings = dict(steps=steps, batch_size=batch_size, lr=lr, r=r, alpha=alpha, seed=seed,
                    train_embeddings=train_embeddings, device=str(device))
    key = _digest(config, state, data, settings)
    try:
        done = _RUNS.setdefault(loss_fn, {})
    except TypeError:            # not weak-referenceable: never remembered
        done = {}
    if key in done:
        return {"losses": list(done[key]["losses"]), "lora": dict(done[key]["lora"])}
    model = GPT(GPTConfig(**config))
    model.load_state_dict(state)
    model.to(device)
    amp = torch.bfloat16 if torch.device(device).type == "cuda" else None
    losses = lora_sft(model, batches_of(data, batch_size, steps, seed), loss_fn, lr=lr, r=r, alpha=alpha, seed=seed,
                      train_embeddings=train_embeddings, autocast_dtype=amp)
    lora = lora_tensors(model, train_embeddings)
    done[key] = {"losses": losses, "lora": lora}
    return {"losses": list(losses), "lora": dict(lora)}


def load_lora(model: torch.nn.Module, lora: dict[str, torch.Tensor], r: int, alpha: float, targets=TARGETS) -> None:
    """Inject LoRA into `model` and set its A and B from sft_for_grading's "lora" (shapes checked)."""
    inject_lora(model, targets, r=r, alpha=alpha)
    mods = lora_modules(model)
    expected = {f"{n}.lora_{x}" for n in mods for x in "AB"} | ({"tok_emb.weight"} & set(lora))
    if set(lora) != expected:
        raise ValueError(f"LoRA tensors do not fit the model: missing {sorted(expected - set(lora))[:3]}, "
                         f"unexpected {sorted(set(lora) - expected)[:3]}")
    with torch.no_grad():
        for n, m in mods.items():
            for x in "AB":
                t, p = lora[f"{n}.lora_{x}"], getattr(m, f"lora_{x}")
                if t.shape != p.shape:
                    raise ValueError(f"{n}.lora_{x} has shape {tuple(t.shape)}, the model needs {tuple(p.shape)}")
                p.copy_(t.to(p.device, p.dtype))
        if "tok_emb.weight" in lora:
            model.tok_emb.weight.copy_(lora["tok_emb.weight"].to(model.tok_emb.weight.device))
    model.eval()
