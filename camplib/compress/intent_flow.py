"""One compression flow on a real task (lab a08, section 6): a06's intent classifier (MiniLM + a
Linear head, camplib.intents) is the teacher; it is pruned (layers, then heads and MLP channels
by Taylor importance), its vocabulary cut to the tokens of the training requests, the result
distilled from the teacher's logits, then its weights stored in int8. Each stage is measured on
the held-out requests (accuracy), and for its parameters, serialized bytes and latency.

    teacher = train_teacher(data["train"], intents, layers=6, lora_steps=150)
    student = compress(teacher, *data["train"], importance_fn, vocabulary_fn, loss_fn, keep_layers=2, ...)
    small = quantized(student)
    stage_row("int8", small, *data["test"])

The three functions passed in are lab a08's exercises (`unit_importance`, `restrict_vocabulary`,
`distillation_loss`); nothing here imports the modules the lab forbids. `compress_for_grading`
runs the flow where the student's code lives and returns plain data (the student's answer);
`student_from_run` rebuilds that model in the grader's process, which quantizes and scores it
itself.
"""
from __future__ import annotations

import copy
import json

import torch
from torch import nn

from camplib.compress.encoder_shrink import (Int8Embedding, RemappedTokenizer, encoder_unit_scores, keep_highest,
                                             prune_encoder_layer, serialized_bytes, used_token_ids, weight_count)
from camplib.compress.static_graph import time_steps
from camplib.intents.classifier import IntentClassifier, fine_tune, fit_probe, load_minilm, report
from camplib.optim import PlainAdamW
from camplib.quant.layers import quantize_model

__all__ = ["train_teacher", "compress", "quantized", "stage_row", "compress_for_grading", "student_from_run"]

_TEACHERS: dict[str, IntentClassifier] = {}
_RUNS: dict[tuple, dict] = {}


def train_teacher(train: tuple[list[str], list[int]], intents: list[str], *, layers: int, lora_steps: int = 0,
                  r: int = 8, batch_size: int = 32, lr: float = 3e-4, head_lr: float = 3e-3, seed: int = 0,
                  device: str = "cpu") -> IntentClassifier:
    """a06's classifier: MiniLM's first `layers` layers, the linear probe, then (lora_steps > 0)
    LoRA r on query/value trained LP-FT and merged into the weights (plain Linear layers again).
    Deterministic; remembered per process (a fresh copy each call)."""
    key = json.dumps([list(train[0]), list(train[1]), list(intents), layers, lora_steps, r, batch_size, lr, head_lr,
                      seed, str(device)])
    if key not in _TEACHERS:
        clf = IntentClassifier(*load_minilm(layers, device), intents=intents)
        for p in clf.encoder.parameters():
            p.requires_grad_(False)
        fit_probe(clf, *train, seed=seed)
        if lora_steps:
            from camplib.lora import inject_lora, lora_modules, merge_lora

            inject_lora(clf.encoder, ["query", "value"], r, 2 * r)
            fine_tune(clf, *train, steps=lora_steps, batch_size=batch_size, lr=lr, head_lr=head_lr, seed=seed)
            merge_lora(clf.encoder)
            for name, module in lora_modules(clf.encoder).items():
                parent, _, child = name.rpartition(".")
                setattr(clf.encoder.get_submodule(parent), child, module.base)
        _TEACHERS[key] = clf.eval()
    return copy.deepcopy(_TEACHERS[key])


@torch.no_grad()
def _logits(clf: IntentClassifier, texts: list[str], batch_size: int = 64) -> torch.Tensor:
    was = clf.training
    clf.eval()
    out = torch.cat([clf(list(texts[i:i + batch_size])).float() for i in range(0, len(texts), batch_size)])
    clf.train(was)
    return out


def compress(teacher: IntentClassifier, texts: list[str], labels: list[int], importance_fn, vocabulary_fn, loss_fn, *,
             keep_layers: int, keep_heads: float, keep_channels: float, steps: int, batch_size: int = 32,
             lr: float = 1e-3, temperature: float = 2.0, alpha: float = 0.9, seed: int = 0,
             on_stage=None) -> IntentClassifier:
    """The student: a copy of `teacher` cut to its first `keep_layers` layers, keeping the
    fractions `keep_heads` / `keep_channels` of each layer's heads / MLP channels with the highest
    `importance_fn` scores (on the training requests), its vocabulary cut by `vocabulary_fn(weight,
    used_ids, unk_id) -> (weight, remap)` to the training requests' tokens, then trained `steps`
    steps on `loss_fn(student_logits, teacher_logits, labels, temperature, alpha)` over the
    training requests. `on_stage(name, classifier)` sees "pruned", "vocabulary" and "distilled"."""
    student = copy.deepcopy(teacher)
    enc = student.encoder
    if not 1 <= keep_layers <= len(enc.encoder.layer):
        raise ValueError(f"keep_layers must be in [1, {len(enc.encoder.layer)}], got {keep_layers}")
    enc.encoder.layer = enc.encoder.layer[:keep_layers]
    enc.config.num_hidden_layers = keep_layers
    for p in student.parameters():
        p.requires_grad_(True)
    scores = encoder_unit_scores(student, texts, labels, importance_fn)
    for layer, h, c in zip(enc.encoder.layer, scores["heads"], scores["channels"]):
        prune_encoder_layer(layer, keep_highest(h, keep_heads), keep_highest(c, keep_channels))
    with torch.no_grad():                                   # the classifier reads at most max_length positions
        pos = enc.embeddings.position_embeddings
        enc.embeddings.position_embeddings = nn.Embedding.from_pretrained(pos.weight[:student.max_length].clone(),
                                                                          freeze=False)
    if on_stage:
        on_stage("pruned", student)
    tok = student.tokenizer
    used = used_token_ids(tok, texts, student.max_length)
    weight, remap = vocabulary_fn(enc.embeddings.word_embeddings.weight.detach(), used, int(tok.unk_token_id))
    weight, remap = torch.as_tensor(weight).float(), torch.as_tensor(remap).long()
    enc.embeddings.word_embeddings = nn.Embedding.from_pretrained(weight.clone().to(student.device), freeze=False,
                                                                  padding_idx=int(remap[tok.pad_token_id]))
    student.tokenizer = RemappedTokenizer(tok, remap)
    if on_stage:
        on_stage("vocabulary", student)
    target = _logits(teacher, texts)
    y = torch.as_tensor(labels)
    opt = PlainAdamW(student.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    student.train()
    for _ in range(steps):
        pick = torch.randint(0, len(texts), (min(batch_size, len(texts)),), generator=gen)
        logits = student([texts[i] for i in pick])
        loss = loss_fn(logits, target[pick].to(logits.device), y[pick].to(logits.device), temperature, alpha)
        opt.minimize_step(loss)
    student.eval()
    if on_stage:
        on_stage("distilled", student)
    return student


def quantized(clf: IntentClassifier) -> IntentClassifier:
    """A copy with every encoder Linear's weight in int8 (absmax per output channel, camplib.quant) and
    the word embeddings in int8 per row (Int8Embedding); LayerNorms, biases and the position
    embeddings stay fp32."""
    small = copy.deepcopy(clf)
    quantize_model(small, "int8", skip=("head",))     # 12 rows: kept fp32 (it also gives the device)
    emb = small.encoder.embeddings
    emb.word_embeddings = Int8Embedding(emb.word_embeddings)
    return small.eval()


def stage_row(name: str, clf: IntentClassifier, texts: list[str], labels: list[int], latency_batch: int = 32) -> dict:
    """{"stage", "parameters" (weights, embeddings and head included), "bytes" (safetensors, measured),
    "ms" (median forward of `latency_batch` held-out requests, tokenizing included), "accuracy"
    (held-out)} of one stage."""
    res = report(clf, texts, labels)
    batch = list(texts[:latency_batch])
    with torch.no_grad():
        ms = time_steps(lambda: clf(batch), n=5, device=clf.device)["median"] * 1e3
    return {"stage": name, "parameters": weight_count(clf), "bytes": serialized_bytes(clf), "ms": ms,
            "accuracy": res["accuracy"], "per_intent": res["per_intent"]}


def compress_for_grading(importance_fn, vocabulary_fn, loss_fn, texts: list[str], labels: list[int],
                         intents: list[str], teacher: dict, student: dict, on_stage=None) -> dict:
    """Where the student's code lives: a06's teacher (`train_teacher(**teacher)`), then
    `compress(**student)` with the student's functions. Returns plain data, the student's answer:
    {"state": {name: tensor} of the fp32 student, "remap": (V,) ids}. Deterministic, so remembered
    per process for the same functions and settings (the notebook's flow and its test run it once;
    `on_stage` is called only when it runs)."""
    key = (importance_fn, vocabulary_fn, loss_fn,
           json.dumps([list(texts), list(labels), list(intents), teacher, student], sort_keys=True))
    if key not in _RUNS:
        t = train_teacher((texts, labels), intents, **teacher)
        small = compress(t, texts, labels, importance_fn, vocabulary_fn, loss_fn, on_stage=on_stage, **student)
        _RUNS[key] = {"state": {k: v.detach().cpu().clone() for k, v in small.state_dict().items()},
                      "remap": small.tokenizer.remap.clone()}
    run = _RUNS[key]
    return {"state": dict(run["state"]), "remap": run["remap"].clone()}


def student_from_run(run: dict, intents: list[str], device: str = "cpu") -> IntentClassifier:
    """The grader's copy of a student model from `compress_for_grading`'s plain data: MiniLM's
    architecture, layers, heads, channels and vocabulary sized by the returned tensors; raises
    ValueError when they do not fit it."""
    state, remap = dict(run["state"]), torch.as_tensor(run["remap"]).long()
    n_layers = len({k.split(".")[3] for k in state if k.startswith("encoder.encoder.layer.")})
    if n_layers < 1:
        raise ValueError("the run returned no encoder layer")
    encoder, tokenizer = load_minilm(n_layers, device)
    emb = encoder.embeddings
    try:
        emb.word_embeddings = nn.Embedding(*state["encoder.embeddings.word_embeddings.weight"].shape)
        emb.position_embeddings = nn.Embedding(*state["encoder.embeddings.position_embeddings.weight"].shape)
        for i, layer in enumerate(encoder.encoder.layer):
            D = layer.attention.self.attention_head_size
            rows = state[f"encoder.encoder.layer.{i}.attention.self.query.weight"].shape[0]
            channels = state[f"encoder.encoder.layer.{i}.intermediate.dense.weight"].shape[0]
            if rows % D:
                raise ValueError(f"layer {i}: {rows} query rows are not whole heads of {D}")
            prune_encoder_layer(layer, range(rows // D), range(channels))
        clf = IntentClassifier(encoder, RemappedTokenizer(tokenizer, remap), intents).to(device)
        clf.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()}, strict=True)
    except (KeyError, RuntimeError) as exc:
        raise ValueError(f"the returned student does not fit MiniLM's architecture: {exc}") from exc
    if remap.numel() != tokenizer.vocab_size or int(remap.max()) >= emb.word_embeddings.num_embeddings:
        raise ValueError(f"remap must map the {tokenizer.vocab_size} token ids onto the "
                         f"{emb.word_embeddings.num_embeddings} kept rows")
    return clf.eval()
