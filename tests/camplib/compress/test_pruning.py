"""Structured pruning: the Taylor score equals the gradient of a gate on each unit, pruned layers
compute exactly what the dense layer computes without the pruned units, and really shrink."""
import pytest
import torch

from camplib.attention import MultiHeadAttention
from camplib.compress.pruning import (
    forward_latency,
    keep_top,
    model_size,
    prune_heads,
    prune_mlp,
    prune_model,
    unit_importance,
    unit_scores,
)
from camplib.model import GPT, MLP, GPTConfig, SwiGLU
from tests.support import assert_close


def gated_attention(attn, x, gate):
    """attn(x) with head h's output (the input of proj) multiplied by gate[h]: the dense reference."""
    D = attn.head_dim
    handle = attn.proj.register_forward_pre_hook(lambda m, a: (a[0] * gate.repeat_interleave(D),))
    try:
        return attn(x)
    finally:
        handle.remove()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_unit_importance_is_the_gate_gradient(dtype):
    """|dL/dgate_h| per sequence, averaged: Michel et al.'s score, from one backward pass."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(24, 4, 2).to(dtype)
    x = torch.randn(3, 5, 24, dtype=dtype)
    target = torch.randn(3, 5, 24, dtype=dtype)
    seen = {}
    attn.proj.register_forward_pre_hook(lambda m, a: seen.update(act=a[0]))
    loss_per_seq = ((attn(x) - target) ** 2).sum(dim=(1, 2))
    act = seen["act"]
    grad = torch.autograd.grad(loss_per_seq.sum(), act)[0]
    score = unit_importance(act.detach(), grad, attn.head_dim)
    expected = torch.zeros(4, dtype=dtype)
    for b in range(3):               # the gate's gradient, sequence by sequence
        gate = torch.ones(4, dtype=dtype, requires_grad=True)
        out = gated_attention(attn, x[b:b + 1], gate)
        ((out - target[b:b + 1]) ** 2).sum().backward()
        expected += gate.grad.abs() / 3
    assert_close("Taylor head scores vs |dL/dgate| per sequence", score, expected)


def test_unit_importance_rejects_bad_shapes():
    with pytest.raises(ValueError, match="does not divide"):
        unit_importance(torch.zeros(1, 2, 10), torch.zeros(1, 2, 10), 3)
    with pytest.raises(ValueError, match="same"):
        unit_importance(torch.zeros(1, 2, 10), torch.zeros(1, 2, 8), 2)


@pytest.mark.parametrize("heads, kv, keep", [(4, 4, [0, 2]), (4, 4, [3]), (6, 3, [0, 2, 5]), (6, 2, [1, 2, 3, 5]),
                                              (6, 3, [2, 3])])
def test_pruned_heads_equal_the_dense_layer_with_those_heads_gated_off(heads, kv, keep):
    torch.manual_seed(1)
    attn = MultiHeadAttention(heads * 4, heads, kv).double()
    x = torch.randn(2, 7, heads * 4, dtype=torch.float64)
    gate = torch.zeros(heads, dtype=torch.float64)
    gate[keep] = 1
    with torch.no_grad():
        expected = gated_attention(attn, x, gate)
        before = model_size(attn)
        prune_heads(attn, keep)
        actual = attn(x)
    assert_close(f"output of attention pruned to heads {keep} of {heads} (kv {kv})", actual, expected, atol=1e-12)
    kept_kv = len({h // (heads // kv) for h in keep})
    assert (attn.n_heads, attn.n_kv_heads) == (len(keep), kept_kv)
    after = model_size(attn)
    d, D = heads * 4, 4
    assert after["parameters"] == d * (len(keep) + 2 * kept_kv) * D + (len(keep) + 2 * kept_kv) * D + len(keep) * D * d + d
    assert after["bytes"] == after["parameters"] * 8 < before["bytes"]    # fresh storages, nothing kept alive


@pytest.mark.parametrize("keep, message", [([], "at least one"), ([0, 4], r"\[0, 4\)"), ([1, 1], "distinct"),
                                           ([0, 1, 2], "breaks grouped-query")])
def test_prune_heads_rejects_bad_requests_and_leaves_the_layer_alone(keep, message):
    attn = MultiHeadAttention(16, 4, 2)
    before = {n: p.clone() for n, p in attn.state_dict().items()}
    with pytest.raises(ValueError, match=message):
        prune_heads(attn, keep)
    assert_close("attention weights after a refused prune", dict(attn.state_dict()), before, atol=0, rtol=0)


@pytest.mark.parametrize("kind", ["gelu", "swiglu"])
def test_pruned_mlp_equals_the_dense_one_with_channels_zeroed(kind):
    torch.manual_seed(2)
    cfg = GPTConfig(d_model=12, d_ff=20, mlp=kind)
    mlp = (SwiGLU(cfg) if kind == "swiglu" else MLP(cfg)).double()
    x = torch.randn(3, 4, 12, dtype=torch.float64)
    keep = [0, 3, 4, 11, 19]
    mask = torch.zeros(20, dtype=torch.float64)
    mask[keep] = 1
    down = mlp.down if kind == "swiglu" else mlp.proj
    handle = down.register_forward_pre_hook(lambda m, a: (a[0] * mask,))
    with torch.no_grad():
        expected = mlp(x)
        handle.remove()
        prune_mlp(mlp, keep)
        actual = mlp(x)
    assert_close(f"{kind} MLP pruned to {len(keep)} of 20 channels", actual, expected, atol=1e-12)
    assert (mlp.down if kind == "swiglu" else mlp.proj).in_features == len(keep)
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        prune_mlp(mlp, [5])
    with pytest.raises(TypeError, match="MLP or SwiGLU"):
        prune_mlp(torch.nn.Linear(2, 2), [0])


@pytest.mark.parametrize("ratio", [-0.1, 1.0, 1.5, float("nan")])
def test_keep_top_refuses_ratios_outside_zero_one(ratio):
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        keep_top(torch.arange(4.0), ratio)


def test_keep_top_keeps_the_best_per_group():
    scores = torch.tensor([0.1, 0.9, 0.5, 0.2, 0.3, 0.8])
    assert keep_top(scores, 0.5) == [1, 2, 5]
    assert keep_top(scores, 0.5, groups=2) == [1, 2, 4, 5]   # floor(1.5) = 1 of 3 pruned per group
    assert keep_top(scores, 0.99) == [1]                      # at least one unit stays


def test_prune_model_shrinks_a_gpt_and_keeps_it_working():
    """A Llama-style GPT (GQA) pruned by its Taylor scores: fewer parameters, bytes and a loss
    close to the dense one at low sparsity; at 0 sparsity nothing changes."""
    torch.manual_seed(3)
    cfg = GPTConfig.llama_style(vocab_size=64, n_layer=2, n_head=4, n_kv_head=2, d_model=32, max_seq_len=16)
    model = GPT(cfg)
    batches = [(torch.randint(0, 64, (4, 15)), torch.randint(0, 64, (4, 15))) for _ in range(2)]
    scores = unit_scores(model, batches)
    assert sorted(scores) == ["blocks.0.attn", "blocks.0.mlp", "blocks.1.attn", "blocks.1.mlp"]
    assert scores["blocks.0.attn"].shape == (4,) and scores["blocks.0.mlp"].shape == (cfg.ff_dim,)
    assert all(p.grad is None for p in model.parameters()), "scoring must not leave gradients"
    x, y = batches[0]
    with torch.no_grad():
        dense_logits, _ = model(x, y)
    dense = model_size(model)
    prune_model(model, scores, 0.0, 0.0)
    with torch.no_grad():
        assert_close("logits after pruning nothing", model(x, y)[0], dense_logits, atol=0, rtol=0)
    prune_model(model, scores, 0.5, 0.5)
    small = model_size(model)
    assert [b.attn.n_heads for b in model.blocks] == [2, 2] and [b.attn.n_kv_heads for b in model.blocks] == [2, 2]
    assert small["parameters"] < dense["parameters"] and small["bytes"] == 4 * small["parameters"]
    assert forward_latency(model, x, repeats=1) > 0


def test_prune_model_removes_heads_of_plain_multi_head_attention():
    """With n_kv_heads == n_heads every head is its own group: half the heads go, kv heads with them."""
    torch.manual_seed(4)
    model = GPT(GPTConfig(vocab_size=32, n_layer=1, n_head=4, d_model=16, max_seq_len=8))
    batch = [(torch.randint(0, 32, (2, 7)), torch.randint(0, 32, (2, 7)))]
    prune_model(model, unit_scores(model, batch), 0.5, 0.25)
    attn = model.blocks[0].attn
    assert (attn.n_heads, attn.n_kv_heads, tuple(attn.qkv.weight.shape)) == (2, 2, (24, 16))
    assert model.blocks[0].mlp.proj.in_features == 48

