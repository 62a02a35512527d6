"""camplib.kernels.triton_flash against torch's attention: outputs and gradients (the Triton
forward, its lse feeding the PyTorch backward), causal, padding and GQA, on shapes that are no
multiple of the tiles. Without a GPU the kernel runs in Triton's interpreter (small shapes only);
the compiled path is checked by test_compiled_on_gpu where CUDA exists."""
import pytest
import torch

from camplib.kernels.triton_flash import interpreted, triton_available, triton_flash_attention
from tests.camplib.kernels.test_flash import outputs_and_grads, random_case, reference_lse, saved_lse, sdpa_reference
from tests.support import assert_close

pytestmark = pytest.mark.skipif(not triton_available(), reason="Triton is a dependency on Linux only")

# fp32 in the interpreter (numpy matmuls): measured worst case 1.0e-5 over these cases, on gradients
# of magnitude ~100 (relative ~1e-7); atol 2e-5 plus rtol 1e-5, as for the PyTorch version.
TOL = dict(atol=2e-5, rtol=1e-5)


@pytest.mark.parity
@pytest.mark.parametrize("seed", [0, 1, 3, 4, 6, 7])  # GQA, causal, padded, L > S, plain
def test_triton_forward_equals_sdpa(seed):
    q, k, v, is_causal, kpm = random_case(seed, torch.float32)
    device = "cuda" if not interpreted() else "cpu"
    q, k, v = q.to(device), k.to(device), v.to(device)
    kpm = kpm.to(device) if kpm is not None else None
    grad_out = torch.randn(q.shape[:-1] + (v.size(-1),), generator=torch.Generator().manual_seed(seed)).to(device)
    case = f"seed {seed} q{tuple(q.shape)} k{tuple(k.shape)} causal={is_causal} padded={kpm is not None}"
    mine = outputs_and_grads(lambda q, k, v: triton_flash_attention(q, k, v, is_causal=is_causal, key_padding_mask=kpm,
                                                                    block_q=16, block_k=32), q, k, v, grad_out)
    ref = outputs_and_grads(lambda q, k, v: sdpa_reference(q.cpu(), k.cpu(), v.cpu(), is_causal,
                                                           None if kpm is None else kpm.cpu()).to(q.device),
                            q, k, v, grad_out)
    for name, a, e in zip(["out", "dq", "dk", "dv"], mine, ref):
        assert_close(f"{name} ({case})", a, e, **TOL)


@pytest.mark.parity
def test_triton_lse_has_the_same_layout_and_values():
    """The Triton forward's lse, as autograd saves it: (B, H, L) for 4-D inputs (GQA case), (B, L) for
    (B, L, E) inputs, equal to torch.logsumexp of the masked scores (fp32, atol 2e-5). (~1-3 s interpreted)"""
    device = "cuda" if not interpreted() else "cpu"
    q, k, v, is_causal, kpm = random_case(1, torch.float32)
    flash = lambda q, k, v: triton_flash_attention(q, k, v, is_causal=is_causal, block_q=16, block_k=16,   # noqa: E731
                                                   key_padding_mask=None if kpm is None else kpm.to(device))
    lse = saved_lse(flash, q.to(device), k.to(device), v.to(device)).cpu()
    assert lse.shape == q.shape[:3], (tuple(lse.shape), tuple(q.shape))
    assert_close("Triton lse (B, H, L)", lse, reference_lse(q, k, is_causal, kpm), **TOL)
    q3, k3, v3 = (t[:, 0].contiguous() for t in (q, q, q))      # one head, no head dimension
    lse3 = saved_lse(lambda q, k, v: triton_flash_attention(q, k, v, block_q=16, block_k=16),
                     q3.to(device), k3.to(device), v3.to(device)).cpu()
    assert lse3.shape == q3.shape[:2], (tuple(lse3.shape), tuple(q3.shape))
    assert_close("Triton lse (B, L)", lse3, reference_lse(q3[:, None], k3[:, None], False, None)[:, 0], **TOL)


@pytest.mark.parametrize("bad, error, message", [
    (dict(dtype=torch.float64), TypeError, "not supported here"),
    (dict(block_q=24), ValueError, "power of two >= 16"),
    (dict(block_k=8), ValueError, "power of two >= 16"),
    (dict(head_dim=300), ValueError, "head_dim=300"),
])
def test_what_the_kernel_cannot_do_is_a_clear_error(bad, error, message):
    device = "cpu" if interpreted() else "cuda"
    shape = (1, 1, 4, bad.get("head_dim", 8))
    q, k, v = (torch.randn(shape, dtype=bad.get("dtype", torch.float32), device=device) for _ in range(3))
    with pytest.raises(error, match=message):
        triton_flash_attention(q, k, v, block_q=bad.get("block_q", 16), block_k=bad.get("block_k", 16))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the compiled kernel")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_on_gpu(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 8, 1000, 64, generator=g, device="cuda", dtype=dtype) for _ in range(3))
    out = triton_flash_attention(q, k, v, is_causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    tol = TOL if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    assert_close(f"compiled Triton forward, {dtype}", out.float(), ref, **tol)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's import order matters only without CUDA")
def test_triton_imported_first_without_the_interpreter_is_a_clear_error():
    """torch._dynamo imports triton; if it comes first with TRITON_INTERPRET unset, Triton is
    compiling and cannot run the kernel on the CPU: the call says what happened and what to do
    (it used to fail inside the kernel: "Cannot call @triton.jit'd outside of the scope of a kernel")."""
    import os
    import subprocess
    import sys

    probe = ("import torch, torch._dynamo\n"
             "from camplib.kernels.triton_flash import triton_flash_attention\n"
             "q = torch.randn(1, 1, 16, 16)\n"
             "try:\n    triton_flash_attention(q, q, q)\nexcept RuntimeError as e:\n    print('ERROR', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert "ERROR triton was imported before camplib.kernels.triton_flash" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "TRITON_INTERPRET=1" in out.stdout
