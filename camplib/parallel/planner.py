"""Which DP x PP x CP x TP layouts fit: memory and communication per rank for a GPT, a number of
devices and the memory of one device (after the Ultra-Scale Playbook's memory and
communication calculators).

Per rank, for one training step with AdamW and ZeRO over dp x cp (`camplib.parallel.hybrid.trainer`;
`zero_stage` 1: the optimizer state sharded, 2: the gradients too, 3: the parameters too):

- parameters: counted exactly on a `meta`-device GPT (no memory), cut like camplib's layers:
  the blocks of the rank's pipeline stage (`split_layers`), the embeddings on the first stage,
  the final norm and LM head on the last; weights split over tp except norms, the position table
  and the biases added after a row-parallel sum (replicated); the vocabulary padded to a multiple
  of tp. Bytes: parameters + gradients (b bytes each) + AdamW state over dp*cp (two moments in
  max(b, 4) bytes, plus an fp32 master copy when b < 4).
- activations (an estimate, not measured here): Korthikanti et al.'s s*b*h*(10 + 24/t +
  5*a*s/(h*t)) bytes per layer and micro-batch at 2-byte activations, scaled to b bytes, with
  s = seq_len/cp, times the layers of a stage and min(pp, m) micro-batches in flight (1F1B).
- communication, bytes handed to the collectives per step (payload) and sent point-to-point:
  TP 4 all-reduces of one activation per block and micro-batch (+1 for the vocab-parallel
  embedding on the first stage; +1 activation and 3 per-token all-reduces of the vocab-parallel
  cross-entropy on the last), PP one activation per micro-batch forward and one backward, DP
  ZeRO-1's reduce-scatter + all-gather on a ring over the dp*cp ranks: 2(dp*cp-1)/(dp*cp) of the
  rank's parameter bytes, CP ring attention (3cp - 2) key/value blocks per layer and micro-batch
  (+ one token count per micro-batch on the last stage); a tied embedding with pp > 1 one
  all-reduce of its table shard on the first and the last stage.

The parameter and communication numbers equal what `camplib.parallel.hybrid.run.train_hybrid`
measures on gloo ranks (tests/camplib/parallel/test_planner.py); the activations are the
formula's.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools

import torch

from camplib.model import GPT, GPTConfig
from camplib.parallel.mesh import MeshShape
from camplib.parallel.pipeline.stages import split_layers
from camplib.parallel.tensor.layers import padded_size

__all__ = ["REPLICATED", "params_per_stage", "layout_cost", "plan"]

# parameter-name endings that every tensor-parallel rank holds whole
REPLICATED = ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "ln_f.weight", "ln_f.bias", "pos_emb.weight",
              "attn.proj.bias", "mlp.proj.bias")


_SHAPES: dict[str, dict[str, tuple[int, ...]]] = {}


@contextlib.contextmanager
def _no_init():
    """Initialisers as no-ops: only shapes are read, and on the meta device torch runs them
    through its reference decompositions, whose first use imports for seconds."""
    names = [n for n in dir(torch.nn.init) if n.endswith("_") and not n.startswith("_")]
    saved = {n: getattr(torch.nn.init, n) for n in names}
    try:
        for n in names:
            setattr(torch.nn.init, n, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for n, fn in saved.items():
            setattr(torch.nn.init, n, fn)


def _dense_counts(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    """{name: shape} of GPT(cfg)'s parameters, from a meta-device model (no memory; cached)."""
    key = repr(cfg)
    if key not in _SHAPES:
        with torch.device("meta"), _no_init():   # one block is enough: every block has the same parameters
            model = GPT(dataclasses.replace(cfg, n_layer=1))
        shapes = {}
        for n, p in model.named_parameters(remove_duplicate=False):   # a tied LM head by its own name too
            if n.startswith("blocks.0."):
                shapes.update({f"blocks.{i}.{n[len('blocks.0.'):]}": tuple(p.shape) for i in range(cfg.n_layer)})
            else:
                shapes[n] = tuple(p.shape)
        _SHAPES[key] = shapes
    return _SHAPES[key]


def params_per_stage(cfg: GPTConfig, pp: int, tp: int) -> list[int]:
    """Parameters one tensor-parallel rank of each pipeline stage holds."""
    if cfg.pos != "learned" or cfg.norm != "layernorm" or cfg.mlp != "gelu":
        raise ValueError("the planner counts GPT-2-style models (learned positions, LayerNorm, GELU MLP); "
                         f"got pos={cfg.pos!r}, norm={cfg.norm!r}, mlp={cfg.mlp!r}")
    shapes = _dense_counts(cfg)
    stages = split_layers(cfg.n_layer, pp)
    out = []
    for s, layers in enumerate(stages):
        total = 0
        for name, shape in shapes.items():
            if name.startswith("blocks."):
                if int(name.split(".")[1]) not in layers:
                    continue
            elif name.startswith(("tok_emb", "pos_emb")) and s != 0:
                continue
            elif name.startswith(("ln_f", "lm_head")) and s != pp - 1:
                continue
            numel = 1
            for n in shape:
                numel *= n
            if name.startswith(("tok_emb", "lm_head")):
                numel = padded_size(cfg.vocab_size, tp) // tp * cfg.d_model
            elif not name.endswith(REPLICATED):
                numel //= tp
            total += numel
        if cfg.tie_embeddings and pp == 1:
            total -= padded_size(cfg.vocab_size, tp) // tp * cfg.d_model   # one table for both
        out.append(total)
    return out


def layout_cost(cfg: GPTConfig, shape: MeshShape, batch: int, seq_len: int, m: int = 1,
                param_bytes: int = 2, zero_stage: int = 1) -> dict:
    """Memory and communication per rank of one step on `shape` (the busiest rank's). Memory
    with `zero_stage` 2/3 (gradients, and parameters, sharded over dp x cp); communication as
    ZeRO-1's (stages 2 and 3 reduce-scatter per micro-batch and stage 3 gathers parameters
    around every use: more, not counted here)."""
    b, t, cp, pp, dp = param_bytes, shape.tp, shape.cp, shape.pp, shape.dp
    z = dp * cp                                                 # ZeRO-1's group: dp x cp
    tied_table = padded_size(cfg.vocab_size, t) // t * cfg.d_model * b if cfg.tie_embeddings and pp > 1 else 0
    stages = params_per_stage(cfg, pp, t)
    layers = [len(r) for r in split_layers(cfg.n_layer, pp)]
    state = 2 * max(b, 4) + (4 if b < 4 else 0)
    s, bm = seq_len // cp, batch // dp // m
    act = bm * s * cfg.d_model * b                              # one micro-batch's activation
    per_layer_act = s * bm * cfg.d_model * (10 + 24 / t + 5 * cfg.n_head * s / (cfg.d_model * t)) * b / 2
    kv_block = 2 * bm * s * (cfg.d_model // t) * b
    rows = []
    for i, (n, n_layers) in enumerate(zip(stages, layers)):
        first, last = i == 0, i == pp - 1
        tp_payload = 0
        if t > 1:
            tp_payload = m * (4 * n_layers * act + (act if first else 0)
                              + (act + 3 * bm * seq_len // cp * max(b, 4) if last else 0))
        tp_payload += 8 if last else 0                           # the loss, averaged over dp x cp
        tp_payload += m * max(b, 4) if last and cp > 1 else 0   # each micro-batch's token count over cp
        tp_payload += tied_table if first or last else 0        # the tied embedding's gradient
        pp_send = m * act * ((0 if last else 1) + (0 if first else 1))
        dp_send = 2 * (z - 1) * (-(-n // z)) * b if z > 1 else 0
        cp_send = m * n_layers * (3 * cp - 2) * kv_block if cp > 1 else 0
        shard = -(-n // z)
        memory = {"params": (shard if zero_stage >= 3 else n) * b, "grads": (shard if zero_stage >= 2 else n) * b,
                  "optimizer": state * shard,
                  "activations": int(per_layer_act * n_layers * min(pp, m))}
        memory["total"] = sum(memory.values())
        rows.append({"params": n, "memory": memory, "tp_allreduce_payload": tp_payload, "pp_send": pp_send,
                     "dp_send": dp_send, "cp_send": cp_send, "send": pp_send + dp_send + cp_send})
    busiest = max(range(pp), key=lambda i: rows[i]["memory"]["total"])
    return {"layout": shape.describe(), "shape": shape, "stages": rows, "busiest_stage": busiest,
            "memory": rows[busiest]["memory"], "send": max(r["send"] for r in rows),
            "tp_allreduce_payload": max(r["tp_allreduce_payload"] for r in rows)}


def plan(cfg: GPTConfig, devices: int, memory_per_device: float, batch: int, seq_len: int, m: int = 1,
         param_bytes: int = 2) -> list[dict]:
    """Every layout of `devices` ranks this model can be cut into whose busiest rank fits in
    `memory_per_device` bytes, least memory first, with its memory and communication."""
    fits = []
    for tp, pp, cp in itertools.product(range(1, devices + 1), repeat=3):
        if devices % (tp * pp * cp):
            continue
        dp = devices // (tp * pp * cp)
        if (cfg.n_head % tp or pp > cfg.n_layer or batch % (dp * m) or (cp > 1 and seq_len % (2 * cp))
                or cfg.d_model % tp):
            continue
        cost = layout_cost(cfg, MeshShape(dp=dp, pp=pp, cp=cp, tp=tp), batch, seq_len, m, param_bytes)
        if cost["memory"]["total"] <= memory_per_device:
            fits.append(cost)
    return sorted(fits, key=lambda c: (c["memory"]["total"], c["send"]))
