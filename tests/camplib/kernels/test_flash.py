"""camplib.kernels.flash against torch's F.scaled_dot_product_attention: outputs and gradients
for causal, key-padding and GQA cases on random shapes (lengths that are no multiple of the tile
included), the memory it saves for backward, and its errors on bad input."""
import pytest
import torch
import torch.nn.functional as F

from camplib.attention import causal_mask, scaled_dot_product_attention
from camplib.kernels.flash import flash_attention
from camplib.memory import saved_activation_bytes
from tests.support import assert_close

# (atol, rtol) per dtype. Measured worst cases over the 12 random cases (this CPU, gradients included):
# fp32 7e-6 (scores up to ~30, sums over 70 keys), fp64 1.3e-14; fp32 gets atol 2e-5 for other CPUs' summation orders.
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-5), torch.float64: dict(atol=1e-12, rtol=1e-10)}


def random_case(seed: int, dtype: torch.dtype):
    """A random shape and masks from `seed`: B 1-2, heads 1-4 with a GQA group of 1, 2 or 4,
    L and S from 1 to 70 (so mostly not multiples of the 16-row tiles), head_dim 1-24."""
    g = torch.Generator().manual_seed(seed)
    pick = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))
    B, Hkv, group, E = pick(1, 2), pick(1, 2), [1, 2, 4][pick(0, 2)], pick(1, 24)
    is_causal, padded = bool(pick(0, 1)), bool(pick(0, 1))
    S = pick(1, 70)
    L = pick(1, S) if is_causal else pick(1, 70)       # causal: L queries are the last L of S positions
    q = torch.randn(B, Hkv * group, L, E, generator=g, dtype=dtype) * 2
    k = torch.randn(B, Hkv, S, E, generator=g, dtype=dtype) * 2
    v = torch.randn(B, Hkv, S, E, generator=g, dtype=dtype)
    kpm = None
    if padded:  # keep the last key of every sequence so that no query ends up with nothing to see
        kpm = torch.rand(B, S, generator=g) > 0.3
        kpm[:, -1] = True
    return q, k, v, is_causal, kpm


def sdpa_reference(q, k, v, is_causal, kpm):
    """torch's fused attention with the same masks spelled out as one bool attn_mask."""
    B, H, L, _ = q.shape
    S, group = k.size(2), q.size(1) // k.size(1)
    mask = torch.ones(B, 1, L, S, dtype=torch.bool)
    if is_causal:
        mask = mask & causal_mask(L, S)
    if kpm is not None:
        mask = mask & kpm[:, None, None, :]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                          attn_mask=mask)


def outputs_and_grads(fn, q, k, v, grad_out):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    return [out.detach(), *torch.autograd.grad(out, (q, k, v), grad_out)]


@pytest.mark.parity
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(12))
def test_flash_equals_sdpa_on_random_shapes(dtype, seed):
    q, k, v, is_causal, kpm = random_case(seed, dtype)
    grad_out = torch.randn(q.shape[:-1] + (v.size(-1),), generator=torch.Generator().manual_seed(seed), dtype=dtype)
    case = f"seed {seed} q{tuple(q.shape)} k{tuple(k.shape)} causal={is_causal} padded={kpm is not None}"
    mine = outputs_and_grads(lambda q, k, v: flash_attention(q, k, v, is_causal=is_causal, key_padding_mask=kpm,
                                                             block_q=16, block_k=16), q, k, v, grad_out)
    ref = outputs_and_grads(lambda q, k, v: sdpa_reference(q, k, v, is_causal, kpm), q, k, v, grad_out)
    for name, a, e in zip(["out", "dq", "dk", "dv"], mine, ref):
        assert_close(f"{name} ({case})", a, e, **TOL[dtype])


@pytest.mark.parity
@pytest.mark.parametrize("block_q,block_k", [(1, 1), (7, 5), (128, 128), (16, 64)])
def test_tile_sizes_do_not_change_the_result(block_q, block_k):
    q, k, v, _, kpm = random_case(3, torch.float64)
    grad_out = torch.randn(q.shape[:-1] + (v.size(-1),), dtype=torch.float64)
    for is_causal in (False, True):
        L = min(q.size(2), k.size(2))
        qc = q[:, :, :L]
        mine = outputs_and_grads(lambda q, k, v: flash_attention(q, k, v, is_causal=is_causal, key_padding_mask=kpm,
                                                                 block_q=block_q, block_k=block_k),
                                 qc, k, v, grad_out[:, :, :L])
        ref = outputs_and_grads(lambda q, k, v: sdpa_reference(q, k, v, is_causal, kpm), qc, k, v, grad_out[:, :, :L])
        for name, a, e in zip(["out", "dq", "dk", "dv"], mine, ref):
            assert_close(f"{name} (tiles {block_q}x{block_k}, causal={is_causal})", a, e, **TOL[torch.float64])


def test_query_that_sees_nothing_gets_zeros_and_zero_gradients():
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64) for _ in range(3))
    kpm = torch.tensor([[False] * 5])
    out, dq, dk, dv = outputs_and_grads(lambda q, k, v: flash_attention(q, k, v, key_padding_mask=kpm, block_k=2),
                                        q, k, v, torch.ones(1, 2, 5, 4, dtype=torch.float64))
    for name, t in [("out", out), ("dq", dq), ("dk", dk), ("dv", dv)]:
        assert_close(name, t, torch.zeros_like(t), atol=0, rtol=0)


def test_half_precision_is_computed_in_fp32():
    q, k, v, is_causal, kpm = random_case(5, torch.float32)
    out = flash_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=is_causal, key_padding_mask=kpm)
    assert out.dtype == torch.bfloat16
    ref = sdpa_reference(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), is_causal, kpm)
    assert_close("bf16 out", out, ref.bfloat16(), atol=2e-2, rtol=2e-2)


def test_saved_for_backward_grows_linearly_not_quadratically():
    """flash keeps O and the log-sum-exp (N*E + N values per head); the math version keeps the
    (N, N) scores and weights. Doubling N doubles the first and quadruples the second."""
    def saved(fn, n):
        q, k, v = (torch.randn(1, 2, n, 16, requires_grad=True) for _ in range(3))
        return saved_activation_bytes(fn, q, k, v)[0]   # q, k, v are inputs: not counted
    flash = lambda q, k, v: flash_attention(q, k, v, is_causal=True, block_q=32, block_k=32)
    math_version = lambda q, k, v: scaled_dot_product_attention(q, k, v, causal_mask(q.size(2)))
    for n in (128, 256):
        assert saved(flash, n) == 2 * n * (16 + 1) * 4, f"flash at N={n}: {saved(flash, n)} bytes"
    assert saved(flash, 512) == 2 * saved(flash, 256)
    assert saved(math_version, 512) >= 3.9 * saved(math_version, 256), "math version should grow as N^2"
    assert saved(math_version, 512) > 10 * saved(flash, 512)


@pytest.mark.parametrize("bad, message", [
    (dict(q=torch.randn(2, 3, 4)), "must all be \\(batch, heads, time, head_dim\\) or all \\(batch, time, head_dim\\)"),
    (dict(q=torch.randn(2, 3)), "must all be"),
    (dict(q=torch.randn(1, 3, 4, 8)), "multiple of n_kv_heads"),
    (dict(q=torch.randn(1, 2, 4, 6)), "agree on batch and head_dim"),
    (dict(q=torch.randint(0, 3, (1, 2, 4, 8))), "dtype"),
    (dict(key_padding_mask=torch.ones(1, 4)), "bool tensor"),
    (dict(key_padding_mask=torch.ones(1, 5, dtype=torch.bool)), "key_padding_mask must be"),
    (dict(block_q=0), "block_q must be a positive int"),
    (dict(block_k=2.5), "block_k must be a positive int"),
])
def test_bad_input_is_a_clear_error(bad, message):
    args = dict(q=torch.randn(1, 2, 4, 8), k=torch.randn(1, 2, 4, 8), v=torch.randn(1, 2, 4, 8))
    args.update({name: value for name, value in bad.items() if name in args})
    options = {name: value for name, value in bad.items() if name not in args}
    with pytest.raises((ValueError, TypeError), match=message):
        flash_attention(args["q"], args["k"], args["v"], **options)


def test_non_contiguous_inputs_give_the_same_numbers():
    q, k, v, is_causal, kpm = random_case(7, torch.float64)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)   # same values, other strides
    assert not qt.is_contiguous() or q.size(1) == 1
    assert_close("out", flash_attention(qt, k, v, is_causal=is_causal, key_padding_mask=kpm),
                 flash_attention(q, k, v, is_causal=is_causal, key_padding_mask=kpm), atol=0, rtol=0)


def test_one_function_whatever_computes_the_forward():
    """FlashAttention takes the forward kernel as an argument (the Triton kernel passes its own);
    backward is always flash_backward, fed by the lse that kernel returned."""
    from camplib.kernels.flash import FlashAttention, flash_forward
    calls = []

    def recording_forward(*args, **kwargs):
        calls.append(kwargs["block_q"])
        return flash_forward(*args, **kwargs)

    q, k, v, is_causal, kpm = random_case(4, torch.float64)
    grad_out = torch.randn(q.shape[:-1] + (v.size(-1),), dtype=torch.float64)
    scale = q.size(-1) ** -0.5
    mine = outputs_and_grads(lambda q, k, v: FlashAttention.apply(q, k, v, kpm, is_causal, scale, 8, 8,
                                                                  recording_forward), q, k, v, grad_out)
    ref = outputs_and_grads(lambda q, k, v: sdpa_reference(q, k, v, is_causal, kpm), q, k, v, grad_out)
    assert calls == [8], f"the given forward kernel was called {calls}"
    for name, a, e in zip(["out", "dq", "dk", "dv"], mine, ref):
        assert_close(f"{name} (custom forward kernel)", a, e, **TOL[torch.float64])


def saved_lse(fn, q, k, v):
    """The log-sum-exp FlashAttention saved for backward: the saved tensor after q, k, v and O."""
    out = fn(*(t.detach().requires_grad_() for t in (q, k, v)))
    saved = out.grad_fn.saved_tensors
    assert len(saved) == 5, [tuple(t.shape) for t in saved]
    return saved[4]


def reference_lse(q, k, is_causal, kpm):
    """torch.logsumexp over the keys of the scaled, masked scores, per (batch, head, query)."""
    group = q.size(1) // k.size(1)
    scores = (q @ k.repeat_interleave(group, 1).transpose(-2, -1)) * q.size(-1) ** -0.5
    mask = torch.ones(q.size(0), 1, q.size(2), k.size(2), dtype=torch.bool)
    if is_causal:
        mask = mask & causal_mask(q.size(2), k.size(2))
    if kpm is not None:
        mask = mask & kpm[:, None, None, :]
    return torch.logsumexp(scores.masked_fill(~mask, float("-inf")), dim=-1)


@pytest.mark.parity
@pytest.mark.parametrize("seed", [0, 1, 3, 4, 6])        # GQA groups of 1-4, causal or not, padded or not
def test_saved_lse_is_batch_heads_queries_and_equals_torch_logsumexp(seed):
    """The lse autograd keeps is (B, H, L), FlashAttention-2's softmax_lse layout (one value per
    query head, GQA included), equal to torch.logsumexp of the scaled masked scores. fp64: 1e-12.
    (~0.1 s)"""
    q, k, v, is_causal, kpm = random_case(seed, torch.float64)
    lse = saved_lse(lambda q, k, v: flash_attention(q, k, v, is_causal=is_causal, key_padding_mask=kpm,
                                                    block_q=16, block_k=16), q, k, v)
    assert lse.shape == q.shape[:3], f"lse shape {tuple(lse.shape)}, expected (B, H, L) = {tuple(q.shape[:3])}"
    assert_close("lse vs torch.logsumexp of the scores", lse, reference_lse(q, k, is_causal, kpm),
                 atol=1e-12, rtol=1e-12)


@pytest.mark.parity
@pytest.mark.parametrize("is_causal", [False, True])
def test_inputs_without_a_head_dimension_are_one_head(is_causal):
    """(B, T, E) inputs (no head dimension, as many assignments write attention): lse is saved as
    (B, T) = torch.logsumexp of the scores, and outputs and gradients equal the 4-D call with one
    head bit for bit, and torch's attention within fp64 rounding (1e-12). (~0.05 s)"""
    g = torch.Generator().manual_seed(5)
    q, k, v, grad_out = (torch.randn(3, 37, 12, generator=g, dtype=torch.float64) for _ in range(4))
    flash = lambda q, k, v: flash_attention(q, k, v, is_causal=is_causal, block_q=16, block_k=8)   # noqa: E731
    lse = saved_lse(flash, q, k, v)
    assert lse.shape == (3, 37), f"lse shape {tuple(lse.shape)}, expected (B, T) = (3, 37)"
    scores = (q @ k.transpose(-2, -1)) / 12 ** 0.5
    if is_causal:
        scores = scores.masked_fill(~causal_mask(37), float("-inf"))
    assert_close("lse of (B, T, E) inputs vs torch.logsumexp", lse, torch.logsumexp(scores, dim=-1), atol=1e-12, rtol=1e-12)
    three_d = outputs_and_grads(flash, q, k, v, grad_out)
    four_d = outputs_and_grads(flash, q[:, None], k[:, None], v[:, None], grad_out[:, None])
    ref = outputs_and_grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal), q, k, v,
                            grad_out)
    for name, a, b, r in zip(["out", "dq", "dk", "dv"], three_d, four_d, ref):
        assert a.shape == r.shape, (name, a.shape, r.shape)
        assert torch.equal(a, b.squeeze(1)), f"{name}: (B, T, E) differs from (B, 1, T, E)"
        assert_close(f"{name} of (B, T, E) inputs vs torch", a, r, atol=1e-12, rtol=1e-10)
