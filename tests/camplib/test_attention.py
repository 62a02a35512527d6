"""camplib.attention and camplib.rope against torch's own implementations."""
import math

import pytest
import torch
import torch.nn.functional as F

from autograder.checks import check_close
from camplib.attention import (
    KVCache,
    MultiHeadAttention,
    causal_mask,
    scaled_dot_product_attention,
    softmax,
)
from camplib.rope import RotaryEmbedding

# (atol, rtol) per dtype for every comparison in this file. Measured worst cases are >10x smaller
# (fp32 ~7e-7, fp64 ~3e-15, gradients included); the margin covers other CPUs' summation orders.
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-12, rtol=1e-10)}
DTYPES = [torch.float32, torch.float64]


def close(name, actual, expected):
    check_close(name, actual, expected, **TOL[expected.dtype])


# ---------------------------------------------------------------- softmax

@pytest.mark.parity
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_softmax_matches_torch(dtype, dim):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 7, generator=g, dtype=dtype) * 3
    close("softmax", softmax(x, dim=dim), torch.softmax(x, dim=dim))


@pytest.mark.parity
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_extreme_values_stay_finite(dtype):
    x = torch.tensor([[1e4, 0.0, -1e4], [1e4, 1e4 - 1, 1e4 - 2], [-1e4, -1e4, -1e4]], dtype=dtype)
    out = softmax(x)
    assert torch.isfinite(out).all()
    close("softmax(extreme)", out, torch.softmax(x, dim=-1))


def test_softmax_partial_and_full_minus_inf_rows():
    ninf = float("-inf")
    x = torch.tensor([[0.0, ninf, 1.0], [ninf, ninf, ninf]], requires_grad=True)
    out = softmax(x)
    close("softmax(partly -inf row)", out[0], torch.softmax(x[0].detach(), dim=-1))
    # design decision: a row with nothing to attend to gives zeros, not torch's NaN
    assert torch.isnan(torch.softmax(x[1].detach(), dim=-1)).all()
    assert torch.equal(out[1].detach(), torch.zeros(3))
    (out * torch.randn(2, 3)).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.equal(x.grad[1], torch.zeros(3))


# ---------------------------------------------------------------- scaled dot-product attention

def make_qkv(seed, dtype, B=2, H=3, L=5, S=5, E=8, Ev=6):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=dtype, requires_grad=True)
            for shape in [(B, H, L, E), (B, H, S, E), (B, H, S, Ev)]]


def make_mask(kind, seed, dtype, B, H, L, S):
    """A mask of each supported kind; no query row is fully masked (compared separately)."""
    g = torch.Generator().manual_seed(seed + 1000)
    if kind == "bool_padding":  # (B, 1, 1, S): per-sequence valid keys, broadcast over heads/queries
        lengths = torch.randint(1, S + 1, (B,), generator=g)
        return (torch.arange(S) < lengths[:, None])[:, None, None, :]
    if kind == "bool_random":  # (L, S) broadcast over batch and heads; key 0 always visible
        m = torch.rand(L, S, generator=g) > 0.5
        m[:, 0] = True
        return m
    if kind == "float":  # additive bias (like ALiBi) with some -inf, per head: (1, H, L, S)
        m = torch.randn(1, H, L, S, generator=g, dtype=dtype)
        m[..., 1:][torch.rand(1, H, L, S - 1, generator=g) > 0.7] = float("-inf")
        return m
    if kind == "float_broadcast":  # (B, 1, L, 1): one bias per query, broadcast along keys and heads
        return torch.randn(B, 1, L, 1, generator=g, dtype=dtype)
    raise ValueError(kind)


SHAPES = [dict(B=2, H=3, L=5, S=5, E=8, Ev=8), dict(B=1, H=2, L=3, S=7, E=16, Ev=4),
          dict(B=3, H=1, L=6, S=2, E=4, Ev=5)]
CASES = ["none", "causal", "bool_padding", "bool_random", "float", "float_broadcast"]


@pytest.mark.parity
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("shape_id", range(len(SHAPES)))
def test_sdpa_matches_torch_values_and_grads(dtype, case, shape_id):
    shape = SHAPES[shape_id]
    seed = 10 * shape_id + CASES.index(case)
    q, k, v = make_qkv(seed, dtype, **shape)
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
    kwargs = {}
    if case == "causal":  # top-left aligned, also when L != S
        kwargs["is_causal"] = True
    elif case != "none":
        kwargs["attn_mask"] = make_mask(case, seed, dtype, shape["B"], shape["H"], shape["L"], shape["S"])
    out = scaled_dot_product_attention(q, k, v, **kwargs)
    ref = F.scaled_dot_product_attention(qr, kr, vr, **kwargs)
    close("attention output", out, ref)
    grad_out = torch.randn_like(ref)
    out.backward(grad_out)
    ref.backward(grad_out)
    for name, a, b in [("dL/dq", q, qr), ("dL/dk", k, kr), ("dL/dv", v, vr)]:
        close(name, a.grad, b.grad)


@pytest.mark.parity
@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_custom_scale_and_unbatched(dtype):
    q, k, v = (t.detach()[0, 0] for t in make_qkv(3, dtype))  # (L, E): no batch dims at all
    close("scale=0.3", scaled_dot_product_attention(q, k, v, scale=0.3),
          F.scaled_dot_product_attention(q, k, v, scale=0.3))


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_sdpa_fully_masked_rows_give_zeros_and_finite_grads(kind):
    q, k, v = make_qkv(4, torch.float64, L=4, S=6)
    allowed = torch.rand(4, 6, generator=torch.Generator().manual_seed(5)) > 0.3
    allowed[:, 0] = True
    allowed[2] = False  # query 2 may attend to nothing
    mask = allowed
    if kind == "float":
        mask = torch.zeros(4, 6, dtype=torch.float64).masked_fill(~allowed, float("-inf"))
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(out[:, :, 2].detach(), torch.zeros_like(out[:, :, 2]))
    # the other rows still match torch (torch 2.13 on CPU also returns zeros for row 2; other
    # backends and versions have returned NaN, so we do not rely on it)
    ref = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), attn_mask=mask)
    keep = [0, 1, 3]
    close("rows that can attend", out[:, :, keep], ref[:, :, keep])
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(q.grad[:, :, 2], torch.zeros_like(q.grad[:, :, 2]))


def test_sdpa_rejects_mask_with_is_causal():
    q, k, v = make_qkv(0, torch.float32)
    with pytest.raises(ValueError):
        scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 5, dtype=torch.bool), is_causal=True)


def test_sdpa_is_causal_blocks_the_future():
    # perturbing key/value t must not change outputs before t
    q, k, v = (t.detach() for t in make_qkv(1, torch.float64, L=6, S=6))
    out = scaled_dot_product_attention(q, k, v, is_causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[..., 4, :] += 1.0
    v2[..., 4, :] += 1.0
    out2 = scaled_dot_product_attention(q, k2, v2, is_causal=True)
    assert torch.equal(out[..., :4, :], out2[..., :4, :])
    assert not torch.allclose(out[..., 4:, :], out2[..., 4:, :])


def test_causal_mask_alignment():
    assert torch.equal(causal_mask(5), torch.ones(5, 5, dtype=torch.bool).tril())
    assert torch.equal(causal_mask(4, 4), torch.ones(4, 4, dtype=torch.bool).tril())
    # bottom-right: 2 new queries at absolute positions 5 and 6 of 7 keys
    expected = torch.ones(7, 7, dtype=torch.bool).tril()[-2:]
    assert torch.equal(causal_mask(2, 7), expected)
    assert causal_mask(1, 7).all()  # the newest token sees everything
    with pytest.raises(ValueError):
        causal_mask(3, 2)


# ---------------------------------------------------------------- multi-head attention

def mha_pair(d_model, n_heads, dtype, seed=0):
    """Our MultiHeadAttention and torch's, holding the same weights."""
    torch.manual_seed(seed)
    ours = MultiHeadAttention(d_model, n_heads).to(dtype)
    ref = torch.nn.MultiheadAttention(d_model, n_heads, batch_first=True, dtype=dtype)
    with torch.no_grad():  # in_proj_weight is (3*d_model, d_model): q rows, then k, then v
        for p in (ref.in_proj_bias, ref.out_proj.bias):  # zero by default, which would hide a mix-up
            p.normal_()
        ours.qkv.weight.copy_(ref.in_proj_weight)
        ours.qkv.bias.copy_(ref.in_proj_bias)
        ours.proj.weight.copy_(ref.out_proj.weight)
        ours.proj.bias.copy_(ref.out_proj.bias)
    return ours.eval(), ref.eval()


@pytest.mark.parity
@pytest.mark.parametrize("dtype", DTYPES)
def test_mha_matches_torch_multihead_attention(dtype):
    ours, ref = mha_pair(32, 4, dtype)
    x = torch.randn(2, 7, 32, dtype=dtype)
    # no mask
    close("MHA, no mask", ours(x, is_causal=False), ref(x, x, x, need_weights=False)[0])
    # causal. Careful: nn.MultiheadAttention's boolean attn_mask means True = NOT allowed,
    # the opposite of scaled_dot_product_attention's True = may attend
    blocked = ~torch.ones(7, 7, dtype=torch.bool).tril()
    close("MHA, causal", ours(x), ref(x, x, x, attn_mask=blocked, need_weights=False)[0])
    # an arbitrary boolean mask, passed with each library's convention
    allowed = torch.rand(7, 7) > 0.4
    allowed[:, 0] = True
    close("MHA, bool mask", ours(x, attn_mask=allowed, is_causal=False),
          ref(x, x, x, attn_mask=~allowed, need_weights=False)[0])
    # the conventions really are opposite: passing ours unchanged to torch gives other numbers
    flipped = ref(x, x, x, attn_mask=allowed, need_weights=False)[0]
    assert not torch.allclose(ours(x, attn_mask=allowed, is_causal=False), flipped)


@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_gqa_equals_mha_with_repeated_kv_heads(n_kv_heads):
    d, H, D = 32, 4, 8
    torch.manual_seed(0)
    gqa = MultiHeadAttention(d, H, n_kv_heads).double()
    mha = MultiHeadAttention(d, H).double()
    rep = H // n_kv_heads
    with torch.no_grad():  # query head h must read kv head h // rep: repeat each kv head's rows
        wq, wk, wv = gqa.qkv.weight.split([H * D, n_kv_heads * D, n_kv_heads * D])
        bq, bk, bv = gqa.qkv.bias.split([H * D, n_kv_heads * D, n_kv_heads * D])
        expand = lambda t: t.view(n_kv_heads, D, *t.shape[1:]).repeat_interleave(rep, 0).flatten(0, 1)
        mha.qkv.weight.copy_(torch.cat([wq, expand(wk), expand(wv)]))
        mha.qkv.bias.copy_(torch.cat([bq, expand(bk), expand(bv)]))
        mha.proj.load_state_dict(gqa.proj.state_dict())
    x = torch.randn(2, 6, d, dtype=torch.float64)
    close("GQA vs repeated-head MHA", gqa(x), mha(x))
    assert gqa.qkv.out_features == (H + 2 * n_kv_heads) * D


@pytest.mark.parametrize("use_rope", [False, True])
@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_kv_cache_decoding_equals_full_attention(use_rope, n_kv_heads):
    torch.manual_seed(0)
    d, H, T = 32, 4, 9
    rope = RotaryEmbedding(d // H, max_seq_len=16) if use_rope else None
    attn = MultiHeadAttention(d, H, n_kv_heads, rope=rope).double().eval()
    x = torch.randn(2, T, d, dtype=torch.float64)
    full = attn(x)
    cache = KVCache(2, n_kv_heads, max_len=T, head_dim=d // H, dtype=torch.float64)
    outs, start = [], 0
    with torch.no_grad():
        for chunk in [3, 1, 2, 1, 1, 1]:  # prefill 3 tokens, then small steps (one of 2)
            outs.append(attn(x[:, start:start + chunk], cache=cache))
            start += chunk
            assert cache.length == start
    close("cached decoding", torch.cat(outs, dim=1), full.detach())
    with pytest.raises(ValueError):  # the cache is full
        cache.update(torch.zeros(2, n_kv_heads, 1, d // H), torch.zeros(2, n_kv_heads, 1, d // H))


# ---------------------------------------------------------------- RoPE

def test_rope_scores_depend_only_on_distance():
    torch.manual_seed(0)
    rope = RotaryEmbedding(16, max_seq_len=64).double()
    q, k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    rot = lambda x, pos: rope(x.view(1, 1, 1, 16), pos)[0, 0, 0]
    s1 = rot(q, 10) @ rot(k, 7)
    s2 = rot(q, 40) @ rot(k, 37)
    check_close("q.k at distance 3", s2, s1, atol=1e-6, rtol=1e-6)  # tables are fp32
    check_close("rotation keeps the norm", rot(q, 30).norm(), q.norm(), atol=1e-6, rtol=1e-6)
    # half-split pairing: feature i turns together with feature i + 8, by angle pos * theta^(-2i/16)
    x = torch.zeros(1, 1, 1, 16, dtype=torch.float64)
    x[..., 1] = 1.0
    y = rope(x, 5)[0, 0, 0]
    angle = 5 * 10000.0 ** (-2 / 16)
    check_close("pair (1, 9)", y[[1, 9]], torch.tensor([math.cos(angle), math.sin(angle)], dtype=torch.float64),
                atol=1e-6, rtol=1e-6)
    assert y[[i for i in range(16) if i not in (1, 9)]].abs().max() == 0


def test_rope_positions_equal_offset():
    rope = RotaryEmbedding(8, max_seq_len=32)
    x = torch.randn(2, 3, 5, 8)
    check_close("explicit positions", rope(x, positions=torch.arange(4, 9)), rope(x, 4))
    check_close("per-batch positions", rope(x, positions=torch.arange(4, 9).expand(2, 5)), rope(x, 4))
    with pytest.raises(ValueError):
        rope(x, 30)
