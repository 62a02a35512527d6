"""Run tensor-parallel code on t ranks and bring back plain data: what tests, benchmarks and lab
a03's grader compare with the dense model. Each runner is a rank function plus one call of
camplib.dist.on_ranks (the library in tensor.layers / tensor.model never imports this module):

- `run_split_gpt`: camplib's whole GPT split (camplib.parallel.tensor.model);
- lab a03's pieces, written by a student and handed over as classes or functions:
  `conjugate_ops_on_ranks` (the f / g autograd functions), `parallel_block_on_ranks` (column and
  row layers put into a dense camplib Block by `parallelize_block`, Megatron's plan) and
  `vocab_loss_on_ranks` (a vocab-parallel cross-entropy).
"""
from __future__ import annotations

import torch
from torch import nn

from camplib.dist import on_ranks
from camplib.dist.counting import count_bytes
from camplib.model import Block, GPTConfig
from camplib.parallel.model_specs import DTYPES
from camplib.parallel.tensor.layers import (
    Shard,
    largest_new_tensor,
    shard_of,
    split_evenly,
    unshard,
)
from camplib.parallel.tensor.model import TensorParallelGPT
from camplib.rope import RotaryEmbedding

__all__ = ["BLOCK_PLAN", "block_layout", "block_rope", "conjugate_ops_on_ranks", "conjugate_rank", "dense_block",
           "parallel_block_on_ranks", "parallelize_block", "run_split_gpt", "split_gpt_rank", "torch_parallelize_block",
           "vocab_loss_on_ranks", "vocab_loss_rank", "vocab_shards", "block_inputs", "block_rank", "join_block_grads"]


def split_gpt_rank(rank: int, t: int, cases: list[dict], idx: torch.Tensor, targets: torch.Tensor) -> dict:
    """A rank function: for each case {"model": dense GPT, "sequence_parallel": bool} load this
    rank's shards of the dense model, run forward and backward on (idx, targets), and return
    {"cases": [...]} with the full logits, the loss, this rank's gradients and the shard layout.
    The dense models reach the ranks by fork, unpickled."""
    out = []
    for case in cases:
        model = TensorParallelGPT.from_dense(case["model"], sequence_parallel=case.get("sequence_parallel", False))
        logits, loss = model(idx, targets)
        loss.backward()
        model.sync_grads()
        out.append({"logits": model.full_logits(logits.detach()), "loss": loss.detach(),
                    "grads": {n: p.grad for n, p in model.named_parameters()}, "layout": model.shard_layout()})
    return {"cases": out}


def run_split_gpt(t: int, cases: list[dict], idx: torch.Tensor, targets: torch.Tensor, *,
                  backend: str = "gloo", timeout: float = 60.0) -> list[dict]:
    """Run `split_gpt_rank` on t ranks; per case: "logits" and "loss" of every rank (lists),
    "grads" joined back into the dense model's shapes, "replicated" (per rank: the gradients
    of the parameters every rank holds whole, which must all be equal) and "layout"."""
    ranks = on_ranks(split_gpt_rank, t, cases, idx, targets, backend=backend, timeout=timeout)["cases"]
    results = []
    for i in range(len(cases)):
        per_rank = [r[i] for r in ranks]
        layout = per_rank[0]["layout"]
        results.append({
            "logits": [r["logits"] for r in per_rank], "loss": [r["loss"] for r in per_rank],
            "grads": {n: unshard([r["grads"][n] for r in per_rank], s) for n, s in layout.items()},
            "replicated": [{n: r["grads"][n] for n, s in layout.items() if s.dim is None} for r in per_rank],
            "layout": layout,
        })
    return results


# -- lab a03: the student's pieces on t ranks, against the dense computation -----------------------
# Each runner takes the student's classes or functions (in the grader: by name, run next to them)
# and returns plain data: tensors per rank, the dense-shaped gradients, collective counts.

BLOCK_PLAN = {"attn.qkv": "column", "attn.proj": "row", "mlp.fc": "column", "mlp.proj": "row",
              "mlp.gate": "column", "mlp.up": "column", "mlp.down": "row"}


def block_rope(config: dict) -> RotaryEmbedding | None:
    """The rotary embedding a Block of GPTConfig(**config) is built with (None: learned positions)."""
    cfg = GPTConfig(**config)
    return RotaryEmbedding(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta) if cfg.pos == "rope" else None


def dense_block(config: dict, seed: int = 0, dtype: str = "float32") -> nn.Module:
    """camplib.model.Block(GPTConfig(**config)) from `seed`, its biases and norm weights moved off
    GPT-2's zeros and ones (a bias counted t times, or a norm weight left out, must show)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        block = Block(GPTConfig(**config), block_rope(config)).to(DTYPES[dtype])
        with torch.no_grad():
            for p in block.parameters():
                if p.dim() == 1:
                    p.add_(0.1 * torch.randn_like(p))
    return block


def block_layout(block: nn.Module, t: int) -> dict[str, Shard]:
    """How each parameter of a dense camplib Block is split over t ranks under BLOCK_PLAN."""
    attn = block.attn
    D = attn.head_dim
    layout = {}
    for name, _ in block.named_parameters():
        module, _, attr = name.rpartition(".")
        kind = BLOCK_PLAN.get(module)
        if kind == "column":
            parts = (attn.n_heads * D, attn.n_kv_heads * D, attn.n_kv_heads * D) if module == "attn.qkv" \
                else (block.get_submodule(module).out_features,)
            layout[name] = Shard(0, parts)
        elif kind == "row" and attr == "weight":
            layout[name] = Shard(1, (block.get_submodule(module).in_features,))
        else:
            layout[name] = Shard(None)
    return layout


def parallelize_block(block: nn.Module, column_cls, row_cls, rank: int, t: int) -> nn.Module:
    """Megatron's plan on a dense camplib Block, in place, like torch's parallelize_module with
    ColwiseParallel / RowwiseParallel: every Linear of BLOCK_PLAN is replaced by
    `column_cls(in, out, bias=)` or `row_cls(in, out, bias=)` holding this rank's shard of its
    weights, and the attention is told it computes n_heads / t (and n_kv_heads / t) heads: the
    dense attention code then runs unchanged on the local heads."""
    layout = block_layout(block, t)
    attn = block.attn
    attn.n_heads = split_evenly(attn.n_heads, t, "n_heads")
    attn.n_kv_heads = split_evenly(attn.n_kv_heads, t, "n_kv_heads")
    for module_name, kind in BLOCK_PLAN.items():
        try:
            dense = block.get_submodule(module_name)
        except AttributeError:
            continue
        cls = column_cls if kind == "column" else row_cls
        layer = cls(dense.in_features, dense.out_features, bias=dense.bias is not None).to(dense.weight.dtype)
        owned = dict(layer.named_parameters())
        with torch.no_grad():
            for attr, p in dense.named_parameters():
                shard = shard_of(p.detach(), layout[f"{module_name}.{attr}"], rank, t)
                mine = owned.get(attr)
                if mine is None or tuple(mine.shape) != tuple(shard.shape):
                    got = None if mine is None else tuple(mine.shape)
                    raise ValueError(f"{cls.__name__}({dense.in_features}, {dense.out_features}).{attr} has shape "
                                     f"{got} on rank {rank} of {t}, expected {tuple(shard.shape)}")
                mine.copy_(shard)
        parent, _, child = module_name.rpartition(".")
        setattr(block.get_submodule(parent), child, layer)
    return block


def _block_rank(rank, t, column_cls, row_cls, config, state, dtype, x, grad_out):
    torch.manual_seed(0)  # the student's layers initialise their own weights before ours are loaded
    block = Block(GPTConfig(**config), block_rope(config)).to(DTYPES[dtype])
    block.load_state_dict(state)
    layout = block_layout(block, t)
    parallelize_block(block, column_cls, row_cls, rank, t)
    x = x.clone().requires_grad_(True)
    with count_bytes() as fwd:
        y = block(x)
    with count_bytes() as bwd:
        (y * grad_out).sum().backward()  # = y.backward(grad_out), without importing sympy in every rank
    params = dict(block.named_parameters())
    grads = {n: (params[n].grad if n in params and params[n].grad is not None else None) for n in layout}
    missing = sorted(n for n, g in grads.items() if g is None)
    return {"y": y.detach(), "x_grad": x.grad, "grads": {n: g for n, g in grads.items() if g is not None},
            "missing": missing, "calls_forward": dict(fwd.calls), "calls_backward": dict(bwd.calls)}


def parallel_block_on_ranks(column_cls, row_cls, t: int, config: dict, state: dict, x: torch.Tensor,
                            grad_out: torch.Tensor, dtype: str = "float32", timeout: float = 60.0) -> dict:
    """A dense Block (GPTConfig(**config), weights `state`) with its linear layers replaced by
    `column_cls` / `row_cls` shards on t ranks: per rank its output "y", input gradient "x_grad",
    the collectives it made in forward and in backward, the parameters left without a gradient
    ("missing"), and "grads": every parameter's gradient in the dense shape (shards joined; the
    replicated ones from rank 0, with "replicated_grads" per rank to compare)."""
    cfg = GPTConfig(**config)  # a split that cannot work fails here, before any rank starts
    split_evenly(cfg.n_head, t, "n_head")
    split_evenly(cfg.kv_heads, t, "n_kv_head")
    out = on_ranks(_block_rank, t, column_cls, row_cls, config, state, dtype, x, grad_out,
                   backend="gloo", timeout=timeout)
    return join_block_grads(out, config, t)


def join_block_grads(out: dict, config: dict, t: int) -> dict:
    """`out` (on_ranks' format of the block's rank function) with "grads" joined into the dense
    shapes (shards joined; the replicated ones from rank 0) and "replicated_grads" per rank."""
    layout = block_layout(Block(GPTConfig(**config), block_rope(config)), t)
    per_rank = out.pop("grads")
    complete = [n for n in layout if all(n in g for g in per_rank)]
    out["grads"] = {n: unshard([g[n] for g in per_rank], layout[n]) for n in complete}
    out["replicated_grads"] = [{n: g[n] for n in complete if layout[n].dim is None} for g in per_rank]
    return out


def block_inputs(t: int, config: dict, state: dict, x: torch.Tensor, grad_out: torch.Tensor,
                 dtype: str = "float32") -> list[dict]:
    """What `block_rank` gets on each of t ranks: x and grad_out (replicated, as in tensor
    parallelism), and the block's weights with the other ranks' shards of every split parameter
    set to NaN. A rank holds only its own shards: an answer it computes without the others'
    contributions is NaN, while parallelize_block never reads another rank's shard."""
    cfg = GPTConfig(**config)  # a split that cannot work fails here, before any rank starts
    split_evenly(cfg.n_head, t, "n_head")
    split_evenly(cfg.kv_heads, t, "n_kv_head")
    layout = block_layout(Block(GPTConfig(**config), block_rope(config)), t)
    ranks = []
    for r in range(t):
        own = {}
        for name, value in state.items():
            shard = layout.get(name)
            if shard is None or shard.dim is None:
                own[name] = value
            else:
                parts = [shard_of(value, shard, k, t) for k in range(t)]
                own[name] = unshard([p if k == r else torch.full_like(p, float("nan")) for k, p in enumerate(parts)],
                                    shard)
        ranks.append({"config": config, "state": own, "dtype": dtype, "x": x, "dy": grad_out})
    return ranks


def block_rank(rank, t, classes, mine: dict) -> dict:
    """One rank of the column / row layers (`classes`) in a dense block, on this rank's own
    `block_inputs` (what autograder.checks.separate_ranks hands each rank)."""
    column_cls, row_cls = classes
    return _block_rank(rank, t, column_cls, row_cls, mine["config"], mine["state"], mine["dtype"], mine["x"],
                       mine["dy"])


def conjugate_rank(rank, t, classes, mine: dict) -> dict:
    """One rank of f and g (`classes`: the copy and reduce autograd functions) on this rank's own
    {"x", "dy"} (what autograder.checks.separate_ranks hands each rank)."""
    copy_cls, reduce_cls = classes
    out = {}
    for name, fn in (("f", copy_cls), ("g", reduce_cls)):
        x = mine["x"].clone().requires_grad_(True)
        with count_bytes() as fwd:
            y = fn.apply(x)
        with count_bytes() as bwd:
            (y * mine["dy"]).sum().backward()  # = y.backward(dy) (see _block_rank)
        out[name] = {"y": y.detach().clone(), "x_grad": x.grad, "calls_forward": dict(fwd.calls),
                     "calls_backward": dict(bwd.calls)}
    return out


def _conjugate_rank(rank, t, copy_cls, reduce_cls, inputs, grads):
    return conjugate_rank(rank, t, (copy_cls, reduce_cls), {"x": inputs[rank], "dy": grads[rank]})


def conjugate_ops_on_ranks(copy_cls, reduce_cls, t: int, inputs: list[torch.Tensor], grads: list[torch.Tensor],
                           timeout: float = 60.0) -> dict:
    """The autograd functions f (`copy_cls`) and g (`reduce_cls`) applied on t ranks to rank r's
    `inputs[r]`, backward from `grads[r]`: {"f": {"y", "x_grad", "calls_forward", "calls_backward":
    [per rank]}, "g": {...}}."""
    if len(inputs) != t or len(grads) != t:
        raise ValueError(f"need one input and one gradient per rank: {len(inputs)} and {len(grads)} for t={t}")
    out = on_ranks(_conjugate_rank, t, copy_cls, reduce_cls, inputs, grads, backend="gloo", timeout=timeout)
    return {name: {key: [r[key] for r in out[name]] for key in out[name][0]} for name in ("f", "g")}


def vocab_loss_rank(rank, t, loss_fn, mine: dict) -> dict:
    """One rank of a vocab-parallel loss on this rank's own {"logits": its columns, "targets",
    "vocab_start"} (what autograder.checks.separate_ranks hands each rank)."""
    local = mine["logits"].clone().requires_grad_(True)
    with count_bytes() as fwd, largest_new_tensor() as big_fwd:
        loss = loss_fn(local, mine["targets"], int(mine["vocab_start"]))
    with count_bytes() as bwd, largest_new_tensor() as big_bwd:
        loss.backward()
    return {"loss": loss.detach().clone(), "logits_grad": local.grad, "calls_forward": dict(fwd.calls),
            "calls_backward": dict(bwd.calls), "largest_bytes": max(big_fwd.largest, big_bwd.largest),
            "local_logits_bytes": local.numel() * local.element_size()}


def vocab_shards(logits: torch.Tensor, targets: torch.Tensor, t: int) -> list[dict]:
    """What vocab_loss_rank gets on each of t ranks: its columns [r V/t, (r+1) V/t) of `logits`."""
    local_v = split_evenly(logits.size(-1), t, "vocab_size")
    return [{"logits": logits[..., r * local_v:(r + 1) * local_v].clone(), "targets": targets,
             "vocab_start": r * local_v} for r in range(t)]


def _vocab_loss_rank(rank, t, loss_fn, logits, targets):
    return vocab_loss_rank(rank, t, loss_fn, vocab_shards(logits, targets, t)[rank])


def vocab_loss_on_ranks(loss_fn, t: int, logits: torch.Tensor, targets: torch.Tensor, timeout: float = 60.0) -> dict:
    """`loss_fn(local_logits, targets, vocab_start)` on t ranks, rank r holding the columns
    [r V/t, (r+1) V/t) of the (N, V) `logits`: per rank its "loss", "calls_forward",
    "calls_backward", "largest_bytes" (the biggest tensor any op made, forward or backward) and
    "local_logits_bytes"; "logits_grad", the ranks' gradient columns joined into (N, V)."""
    split_evenly(logits.size(-1), t, "vocab_size")  # before any rank starts
    out = on_ranks(_vocab_loss_rank, t, loss_fn, logits, targets, backend="gloo", timeout=timeout)
    grads = out.pop("logits_grad")
    out["logits_grad"] = None if any(g is None for g in grads) else torch.cat(grads, dim=-1)
    return out


def torch_parallelize_block(block: nn.Module, mesh) -> nn.Module:
    """BLOCK_PLAN through torch's own tensor parallelism (`parallelize_module` with ColwiseParallel /
    RowwiseParallel on a 1-D DeviceMesh), in place: the side-by-side reference for
    `parallelize_block`. torch splits a weight into contiguous chunks, so the fused q|k|v rows are
    first reordered to [q_0 k_0 v_0 | q_1 k_1 v_1 | ...]: each rank's chunk then holds its heads
    (torchtitan keeps q, k and v separate instead). The attention computes n_heads / t heads."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    t = mesh.size()
    layout = block_layout(block, t)
    params = dict(block.named_parameters())
    with torch.no_grad():
        for name in ("attn.qkv.weight", "attn.qkv.bias"):
            if name in params:
                p = params[name]
                p.copy_(torch.cat([shard_of(p.detach(), layout[name], r, t) for r in range(t)], dim=0))
    block.attn.n_heads = split_evenly(block.attn.n_heads, t, "n_heads")
    block.attn.n_kv_heads = split_evenly(block.attn.n_kv_heads, t, "n_kv_heads")
    names = {n for n, _ in block.named_modules()}
    plan = {m: ColwiseParallel() if kind == "column" else RowwiseParallel() for m, kind in BLOCK_PLAN.items() if m in names}
    return parallelize_module(block, mesh, plan)
