"""camplib.rope's two pairings, each against its reference, and the checkpoint conversion.

- half-split vs transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb (fp32 tables, as HF's);
- interleaved vs a complex-number implementation written from the RoFormer paper and Meta's
  llama/model.py (precompute_freqs_cis, view_as_complex, multiply, view_as_real);
- a GPT with interleaved RoPE and q/k rows permuted gives the half-split model's logits.
Tolerances: fp32 atol 1e-6, rtol 1e-5 (the same products summed in another order); fp64 1e-12.
"""
import pytest
import torch

from camplib.hf import to_hf
from camplib.model import GPT, GPTConfig, convert_rope_pairing
from camplib.rope import RotaryEmbedding, permute_qk_rows
from tests.support import assert_close

FP32 = dict(atol=1e-6, rtol=1e-5)
FP64 = dict(atol=1e-12, rtol=1e-12)


def meta_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Meta's Llama RoPE for x (B, H, T, D): pairs (2i, 2i+1) as complex numbers times e^{i m theta_i}."""
    D = x.size(-1)
    freqs = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64)[: D // 2] / D))
    angles = torch.outer(positions.double(), freqs)                    # (T, D/2)
    freqs_cis = torch.polar(torch.ones_like(angles), angles)           # e^{i m theta_i}
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], D // 2, 2))
    return torch.view_as_real(xc * freqs_cis).flatten(-2).to(x.dtype)


@pytest.mark.parity
@pytest.mark.parametrize("theta, offset", [(10000.0, 0), (500000.0, 7)])
def test_half_split_equals_transformers_llama(theta, offset):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    B, H, T, D = 2, 3, 9, 16
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(B, H, T, D, generator=g), torch.randn(B, H, T, D, generator=g)
    config = LlamaConfig(hidden_size=H * D, num_attention_heads=H, max_position_embeddings=64, rope_theta=theta)
    hf_rope = LlamaRotaryEmbedding(config)
    positions = torch.arange(offset, offset + T).expand(B, T)
    cos, sin = hf_rope(q, positions)
    ref_q, ref_k = apply_rotary_pos_emb(q, k, cos, sin)
    ours = RotaryEmbedding(D, 64, theta, pairing="half")
    assert_close(f"q, half-split, theta={theta}", ours(q, offset), ref_q, **FP32)
    assert_close(f"k, half-split, theta={theta}", ours(k, offset), ref_k, **FP32)


@pytest.mark.parity
@pytest.mark.parametrize("dtype, tol", [(torch.float64, FP64), (torch.float32, FP32)])
def test_interleaved_equals_complex_multiplication(dtype, tol):
    x = torch.randn(2, 3, 11, 8, generator=torch.Generator().manual_seed(1), dtype=dtype)
    ours = RotaryEmbedding(8, 32, pairing="interleaved").to(dtype)
    for offset in (0, 5):
        expected = meta_rope(x, torch.arange(offset, offset + 11))
        # our tables are fp32 (as HF's), so fp64 inputs agree only to fp32 angle precision
        assert_close(f"interleaved, offset {offset}, {dtype}", ours(x, offset), expected,
                     **(FP32 if dtype == torch.float64 else tol))
    per_batch = torch.tensor([[3, 4, 5] + list(range(6, 14)), list(range(11))])
    assert_close("interleaved with (B, T) positions", ours(x, positions=per_batch)[1], ours(x, 0)[1], **tol)


def test_pairings_differ_and_permutation_maps_one_to_the_other():
    """rope_interleaved(P x) == P rope_half(x), with P the per-head feature permutation."""
    D = 8
    x = torch.randn(1, 2, 5, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    half, inter = RotaryEmbedding(D, 16, pairing="half").double(), RotaryEmbedding(D, 16, pairing="interleaved").double()
    assert (half(x) - inter(x)).abs().max() > 1e-2  # genuinely different conventions
    P = permute_qk_rows(torch.eye(D, dtype=torch.float64), 1, "interleaved")  # row vectors: x -> x P^T
    assert_close("rope_interleaved(P x) == P rope_half(x)", inter(x @ P.T), half(x) @ P.T, **FP64)


def test_permutation_is_transformers_permute_and_round_trips():
    n_heads, D, d_in = 4, 6, 5
    w = torch.randn(n_heads * D, d_in, generator=torch.Generator().manual_seed(3))

    def hf_permute(w, n_heads, dim1, dim2):  # transformers/models/llama/convert_llama_weights_to_hf.py
        return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)

    assert torch.equal(permute_qk_rows(w, n_heads, "half"), hf_permute(w, n_heads, n_heads * D, d_in))
    assert torch.equal(permute_qk_rows(permute_qk_rows(w, n_heads, "interleaved"), n_heads, "half"), w)
    b = torch.arange(n_heads * D).float()
    assert torch.equal(permute_qk_rows(permute_qk_rows(b, n_heads, "half"), n_heads, "interleaved"), b)
    with pytest.raises(ValueError):
        permute_qk_rows(torch.randn(10, 3), 4, "half")
    with pytest.raises(ValueError):
        RotaryEmbedding(8, 16, pairing="complex")


@pytest.mark.parity
@pytest.mark.parametrize("bias, n_kv_head", [(False, 2), (True, 4)])
def test_interleaved_model_with_permuted_weights_gives_the_same_logits(bias, n_kv_head):
    torch.manual_seed(0)
    cfg = GPTConfig.llama_style(vocab_size=50, d_model=32, n_head=4, n_kv_head=n_kv_head, n_layer=2,
                                max_seq_len=16, bias=bias)
    half = GPT(cfg).double().eval()
    with torch.no_grad():  # N(0, 0.02) weights give near-uniform attention, where RoPE barely shows
        for block in half.blocks:
            block.attn.qkv.weight.mul_(25)
    inter = convert_rope_pairing(half, "interleaved").eval()
    assert inter.config.rope_pairing == "interleaved" and next(inter.parameters()).dtype == torch.float64
    idx = torch.randint(0, 50, (2, 16))
    ref = half(idx)[0]
    assert_close("logits, interleaved + permuted vs half-split", inter(idx)[0], ref, atol=1e-10, rtol=1e-10)
    unpermuted = GPT(inter.config).double().eval()
    unpermuted.load_state_dict(half.state_dict())
    assert (unpermuted(idx)[0] - ref).abs().max() > 1e-2  # without the permutation: a different model
    back = convert_rope_pairing(inter, "half")
    assert_close("converted back to half-split", back(idx)[0], ref, atol=1e-10, rtol=1e-10)
    with pytest.raises(ValueError, match="half-split"):
        to_hf(inter)


@pytest.mark.parity
@pytest.mark.parametrize("positions", [None, "per-row"])
def test_half_turn_equals_the_written_out_rotation_values_and_gradients(positions):
    """RotaryEmbedding's half pairing runs on a Function with its backward written out: equal to
    x * cos + rotate_half(x) * sin (HF's apply_rotary_pos_emb), values and the input's gradient,
    fp64, on a transposed (non-contiguous) view as the attention passes it, with the table's
    rows or per-row positions (left padding); gradcheck on a small case. (~0.05 s)"""
    from camplib.rope import rotate_half

    B, T, H, D = 2, 5, 3, 8
    g = torch.Generator().manual_seed(1)
    rope = RotaryEmbedding(D, 16).double()
    pos = None if positions is None else torch.randint(0, 16, (B, T), generator=g)
    base = torch.randn(B, T, H, D, generator=g, dtype=torch.float64)
    grad = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)

    def written_out(x):
        cos, sin = (rope.cos[:T], rope.sin[:T]) if pos is None else (rope.cos[pos][:, None], rope.sin[pos][:, None])
        return x * cos + rotate_half(x) * sin

    results = []
    for fn in (lambda x: rope(x, 0, pos), written_out):
        leaf = base.clone().requires_grad_()
        y = fn(leaf.transpose(1, 2))
        results.append((y, torch.autograd.grad(y, leaf, grad)[0]))
    (y, dx), (y_ref, dx_ref) = results
    assert_close("RoPE (half) output", y, y_ref, **FP64)
    assert_close("RoPE (half) d/dx", dx, dx_ref, **FP64)
    x = torch.randn(1, 2, 3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: RotaryEmbedding(4, 8).double()(t, 2), (x,))


def test_half_turn_without_autograd_is_the_same_rotation_and_training_keeps_the_function():
    """Inference (no_grad: the serving engine, generation) rotates directly, without the autograd
    Function's per-call cost; bit for bit the Function's forward. With gradients on, the Function
    (its written-out backward) still runs."""
    rope = RotaryEmbedding(8, 16)
    x = torch.randn(2, 3, 5, 8, generator=torch.Generator().manual_seed(2))
    cos, sin = rope.cos[:5], rope.sin[:5]
    with torch.no_grad():
        direct = rope.turn(x, cos, sin)
    trained = rope.turn(x.clone().requires_grad_(), cos, sin)
    assert type(trained.grad_fn).__name__ == "_HalfTurnBackward", f"training path: grad_fn {trained.grad_fn}"
    assert torch.equal(direct, trained.detach()), "no-grad rotation differs from the Function's forward"
