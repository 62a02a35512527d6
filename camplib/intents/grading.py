"""a06's outcome run: MiniLM fine-tuned with a student's `inject_lora`, for a graded test.

`lora_run_for_grading` runs where the student's code lives (their kernel, or their sandbox during
grading): it builds the classifier, fits the linear probe, calls the student's injection, trains
(LP-FT, camplib.intents.classifier.fine_tune) and returns plain data: every tensor that was
trained, under the model's parameter names, and each LoRA layer's `scale`. What it returns is
the student's answer, never evidence: `classifier_from_run`, in the grader's own process, loads
those tensors into a fresh MiniLM with camplib's LoRA and the grader scores it on held-out
requests itself. Parameters of the base the student's injection forgot to freeze were trained
too; they are returned and loaded like the rest, so the score is the model the student trained.

The run is deterministic, so it is remembered per process for the same injection function and
settings: the notebook's demonstration and its test train once, not twice. Nothing here imports
camplib.lora at module level (a06 forbids it to students and leaves it out of their sandbox).
"""
from __future__ import annotations

import json
import weakref
from typing import Callable

import torch

from camplib.intents.classifier import IntentClassifier, fine_tune, fit_probe, load_minilm

__all__ = ["TARGETS", "lora_run_for_grading", "classifier_from_run"]

TARGETS = ["query", "value"]
_RUNS: "weakref.WeakKeyDictionary[Callable, dict[str, dict]]" = weakref.WeakKeyDictionary()


def lora_run_for_grading(inject_fn: Callable, texts: list[str], labels: list[int], intents: list[str], *,
                         layers: int, steps: int, batch_size: int, lr: float, head_lr: float, r: int,
                         seed: int, device: str = "cpu", targets: list[str] | None = None,
                         **schedule) -> dict:
    """Probe, then `inject_fn(encoder, targets, r, 2 * r)` (TARGETS by default) and fine-tune;
    {"losses", "trained": {parameter name: tensor} (LoRA's A and B, the head as
    "head.weight"/"head.bias", anything else that required grad), "scale": {module name: float}}.
    `schedule`: fine_tune's keywords (label_smoothing, warmup, cosine)."""
    targets = list(TARGETS if targets is None else targets)
    key = json.dumps([list(texts), list(labels), list(intents), layers, steps, batch_size, lr, head_lr, r, seed,
                      str(device), targets, sorted(schedule.items())])
    try:
        done = _RUNS.setdefault(inject_fn, {})
    except TypeError:                      # not weak-referenceable: never remembered
        done = {}
    if key not in done:
        encoder, tokenizer = load_minilm(layers, device)
        clf = IntentClassifier(encoder, tokenizer, intents)
        for p in clf.encoder.parameters():
            p.requires_grad_(False)
        fit_probe(clf, texts, labels, seed=seed)
        inject_fn(clf.encoder, targets, r, 2 * r)
        losses = fine_tune(clf, texts, labels, steps, batch_size, lr, head_lr, seed=seed, **schedule)
        trained = {f"encoder.{n}": p.detach().cpu().clone() for n, p in clf.encoder.named_parameters() if p.requires_grad}
        trained.update({f"head.{n}": p.detach().cpu().clone() for n, p in clf.head.named_parameters()})
        scale = {n: float(m.scale) for n, m in clf.encoder.named_modules() if hasattr(m, "lora_A")}
        done[key] = {"losses": losses, "trained": trained, "scale": scale}
    run = done[key]
    return {"losses": list(run["losses"]), "trained": dict(run["trained"]), "scale": dict(run["scale"])}


def classifier_from_run(run: dict, intents: list[str], layers: int, r: int, device: str = "cpu",
                        inject_fn: Callable | None = None, targets: list[str] | None = None) -> IntentClassifier:
    """A fresh MiniLM with LoRA injected by `inject_fn` (camplib.lora's by default, each layer
    then set to the run's own scale) on `targets` (TARGETS by default: the run's) and the run's
    trained tensors loaded; raises ValueError when they do not fit the model."""
    targets = list(TARGETS if targets is None else targets)
    encoder, tokenizer = load_minilm(layers, device)
    clf = IntentClassifier(encoder, tokenizer, intents)
    if inject_fn is None:
        from camplib.lora import inject_lora as inject_fn
    inject_fn(clf.encoder, targets, r, 2 * r)
    for name, module in clf.encoder.named_modules():
        if not hasattr(module, "lora_A"):
            continue
        if name not in run["scale"]:
            raise ValueError(f"the run has no LoRA layer {name!r} (it wrapped {sorted(run['scale'])[:3]}...)")
        module.scale = float(run["scale"][name])
    params = dict(clf.named_parameters())
    unknown = sorted(set(run["trained"]) - set(params))
    if unknown:
        raise ValueError(f"trained tensors that MiniLM with LoRA on {targets} does not have: {unknown[:3]}")
    with torch.no_grad():
        for name, value in run["trained"].items():
            if tuple(value.shape) != tuple(params[name].shape):
                raise ValueError(f"{name} has shape {tuple(value.shape)}, the model needs {tuple(params[name].shape)}")
            params[name].copy_(value.to(params[name].device, params[name].dtype))
    return clf.eval()
