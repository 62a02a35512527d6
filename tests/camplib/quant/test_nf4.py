"""camplib.quant.nf4 against bitsandbytes 0.50.2 on the CPU: the code book, the packed 4-bit codes
and the block absmax bit for bit (with and without double quantization, fp32/bf16/fp16, blocks
of 32-256, tails shorter than a block), and the double-quantized absmax codes bit for bit against
bitsandbytes' reference kernel; its compiled CPU kernel is shown to misplace a few of them."""
import pytest
import torch

from camplib.quant.nf4 import NF4_CODE, dequantize_nf4, dynamic_map, quantize_blockwise, quantize_nf4
from tests.support import assert_close

bnb_functional = pytest.importorskip("bitsandbytes.functional")
pytestmark = pytest.mark.parity

CASES = [((64, 128), 64, torch.float32), ((33, 70), 64, torch.float32), ((300, 257), 128, torch.bfloat16),
         ((96, 384), 64, torch.float16), ((5, 41), 32, torch.float32), ((128, 256), 256, torch.bfloat16)]


def bnb_reference_blockwise(x, blocksize):
    """bitsandbytes' pure-PyTorch kernel ("default" backend) for 8-bit blockwise quantization,
    called past the compiled CPU kernel that is registered for CPU tensors."""
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
    return torch.ops.bitsandbytes.quantize_blockwise.default.redispatch(keys, x, bnb_functional.create_dynamic_map(),
                                                                        blocksize)


def sample(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 0.02
    x[0, 0] = 0.5                                              # an outlier: one block's absmax far above the rest
    return x.to(dtype)


def test_code_books_are_bitsandbytes():
    assert NF4_CODE.tolist() == bnb_functional.get_4bit_type("nf4", device="cpu").tolist()
    assert torch.equal(dynamic_map(), bnb_functional.create_dynamic_map())


@pytest.mark.parametrize("shape,blocksize,dtype", CASES, ids=[f"{s[0]}x{s[1]}-b{b}-{str(d)[6:]}" for s, b, d in CASES])
def test_nf4_equals_bitsandbytes_bit_for_bit(shape, blocksize, dtype):
    x = sample(shape, dtype, seed=shape[0])
    ref, state = bnb_functional.quantize_4bit(x, blocksize=blocksize, quant_type="nf4")
    ours = quantize_nf4(x, blocksize)
    assert torch.equal(ours.packed, ref.reshape(-1)), "packed NF4 codes differ from bitsandbytes'"
    assert torch.equal(ours.absmax, state.absmax), "block absmax differs from bitsandbytes'"
    # bitsandbytes dequantizes bf16/fp16 and a short last block through torch.compile: 6-14 s a call here
    fast = dtype == torch.float32 and x.numel() % blocksize == 0
    if fast:
        assert torch.equal(dequantize_nf4(ours), bnb_functional.dequantize_4bit(ref, state))

    ref2, state2 = bnb_functional.quantize_4bit(x, blocksize=blocksize, quant_type="nf4", compress_statistics=True)
    ours2 = quantize_nf4(x, blocksize, double_quant=True)
    assert torch.equal(ours2.packed, ref2.reshape(-1)), "packed codes with double quantization differ"
    assert torch.equal(ours2.absmax_offset, state2.offset), "the mean subtracted from absmax differs"
    assert torch.equal(ours2.absmax_scale, state2.state2.absmax), "the absmax of the absmax blocks differs"
    codes, scale2 = bnb_reference_blockwise(state.absmax - state.absmax.mean(), 256)
    assert torch.equal(ours2.absmax, codes) and torch.equal(ours2.absmax_scale, scale2), \
        "double-quantized absmax codes differ from bitsandbytes' reference kernel"
    # bitsandbytes' compiled CPU kernel: the same codes for (almost) all blocks, never more than 3 codes off
    off = (ours2.absmax.int() - state2.absmax.int()).abs()
    assert int(off.max()) <= 3 and float((off > 0).float().mean()) <= 0.05, (int(off.max()), float((off > 0).float().mean()))
    if fast:
        assert_close("dequantized weight with double quantization vs bitsandbytes'", dequantize_nf4(ours2),
                     bnb_functional.dequantize_4bit(ref2, state2), atol=float(x.abs().max()) * 0.01, rtol=0)


def test_compiled_cpu_kernel_misplaces_a_few_codes_that_the_nearest_rule_places():
    """Why double quantization is compared with the reference kernel: the compiled one codes
    3.07e-6 as 2.1e-5 when 3.25e-6 is a code value (seen on 0.50.2; kept as a record)."""
    x = torch.randn(20000, generator=torch.Generator().manual_seed(1)) * 0.05
    compiled, absmax = bnb_functional.quantize_blockwise(x, blocksize=256)
    ours, ours_absmax = quantize_blockwise(x, dynamic_map(), 256)
    reference, _ = bnb_reference_blockwise(x, 256)
    assert torch.equal(ours, reference) and torch.equal(ours_absmax, absmax.absmax)
    code = dynamic_map()
    err_ours = (code[ours.long()] - x / ours_absmax.repeat_interleave(256)[:x.numel()]).abs()
    err_compiled = (code[compiled.long()] - x / ours_absmax.repeat_interleave(256)[:x.numel()]).abs()
    assert bool((err_ours <= err_compiled).all()), "the nearest rule should never be farther than the compiled kernel"


def test_nf4_error_and_bytes():
    x = torch.randn(256, 512, generator=torch.Generator().manual_seed(0))
    w, w2 = quantize_nf4(x), quantize_nf4(x, double_quant=True)
    rel = float((dequantize_nf4(w) - x).norm() / x.norm())
    assert 0.05 < rel < 0.12, f"NF4 relative error {rel:.3f} (measured about 0.09 on normal weights)"
    bits = lambda t: sum(v.numel() * v.element_size() for v in t.tensors()) * 8 / x.numel()
    assert abs(bits(w) - 4.5) < 1e-9 and abs(bits(w2) - (4 + 8 / 64 + 32 / (64 * 256) + 32 / x.numel())) < 1e-9, \
        (bits(w), bits(w2))


def test_bad_input():
    with pytest.raises(TypeError, match=r"torch.int32 of shape \(4, 4\)"):
        quantize_nf4(torch.zeros(4, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="blocksize"):
        quantize_nf4(torch.zeros(4, 4), blocksize=7)
