"""camplib.kernels.fused_norm (what camplib.model.RMSNorm trains on) against torch's
nn.RMSNorm (F.rms_norm) in fp64 and fp32 and Hugging Face Llama's LlamaRMSNorm in bf16 (HF rounds x_hat to
the input's dtype before the weight, as camplib does; torch's F.rms_norm does not): output and
gradients (x and weight), and that it saves less for backward."""
import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from camplib.kernels.fused_norm import rms_norm
from camplib.memory import saved_activation_bytes
from camplib.model import RMSNorm
from tests.support import assert_close

# fp64: same formula, other association: measured <= 4e-16; fp32: measured <= 5e-7 on these sizes
TOL = {torch.float64: dict(atol=1e-12, rtol=1e-12), torch.float32: dict(atol=1e-5, rtol=1e-5)}


def both(dtype, shape=(3, 5, 48), seed=0):
    """(camplib's model RMSNorm, the reference): (y, dx, dweight) of each."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=dtype) * 3
    dy = torch.randn(shape, generator=g, dtype=dtype)
    weight = torch.randn(shape[-1], generator=g, dtype=dtype)
    ours = RMSNorm(shape[-1], eps=1e-6).to(dtype)
    ref = (LlamaRMSNorm(shape[-1], eps=1e-6) if dtype == torch.bfloat16
           else torch.nn.RMSNorm(shape[-1], eps=1e-6)).to(dtype)       # torch's: F.rms_norm
    results = []
    for module in (ours, ref):
        with torch.no_grad():
            module.weight.copy_(weight)
        xi = x.clone().requires_grad_()
        y = module(xi)
        dx, dw = torch.autograd.grad(y, (xi, module.weight), dy)
        results.append((y, dx, dw))
    return results


@pytest.mark.parity
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", [(3, 5, 48), (7, 1), (2, 300)])
def test_equals_torch_rms_norm_forward_and_backward(dtype, shape):
    mine, ref = both(dtype, shape)
    for name, a, e in zip(["y", "dx", "dweight"], mine, ref):
        assert_close(f"{name} ({dtype}, {shape})", a, e, **TOL[dtype])


def test_bf16_within_bf16_precision():
    mine, ref = both(torch.bfloat16)
    for name, a, e in zip(["y", "dx", "dweight"], mine, ref):
        assert a.dtype == torch.bfloat16, f"{name} came back as {a.dtype}"
        assert_close(f"{name} (bf16)", a.float(), e.float(), atol=5e-2, rtol=2e-2)


def test_saves_only_one_number_per_row():
    x = torch.randn(4, 32, 64, requires_grad=True)
    w = torch.ones(64, requires_grad=True)
    fused_bytes, _ = saved_activation_bytes(rms_norm, x, w, 1e-6)
    ref = LlamaRMSNorm(64)
    ref_bytes, _ = saved_activation_bytes(ref, x, exclude=list(ref.parameters()))
    assert fused_bytes == 4 * 32 * 4, f"fused RMSNorm saved {fused_bytes} bytes, expected 1/rms per row (512)"
    # written out (HF's), fp32: the normalised x (what weight * x_hat needs) and 1/rms (for x * r)
    assert ref_bytes == x.numel() * 4 + 512, f"HF's written-out RMSNorm saved {ref_bytes} bytes"


@pytest.mark.parametrize("x, w, error, message", [
    (torch.arange(6).reshape(2, 3), torch.ones(3), TypeError, "floating-point"),
    (torch.randn(2, 3), torch.ones(4), ValueError, "weight must have shape \\(3,\\)"),
])
def test_bad_input_is_a_clear_error(x, w, error, message):
    with pytest.raises(error, match=message):
        rms_norm(x, w)
