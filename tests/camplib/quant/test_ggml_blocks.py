"""camplib.quant.ggml_blocks against the `gguf` package (llama.cpp's own numpy port of
ggml-quants.c): Q8_0, Q4_0 and Q4_1 codes bit for bit in both directions, on random shapes and
seeds, with all-zero blocks, constant blocks and exact halves (the rounding cases)."""
import numpy as np
import pytest
import torch

from camplib.quant.ggml_blocks import BLOCK_BYTES, dequantize_blocks, quantize_blocks

gguf_quants = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType  # noqa: E402

pytestmark = pytest.mark.parity
KINDS = sorted(BLOCK_BYTES)


def sample(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows, blocks = torch.randint(1, 40, (2,), generator=g).tolist()
    x = torch.randn(rows, 32 * blocks, generator=g) * 10 ** torch.empty(1).uniform_(-3, 1, generator=g).item()
    x[0, :32] = 0                                            # all zero: scale 0, codes 0 (no 0/0)
    if rows > 1:
        x[1, :32] = 0.75                                     # constant: Q4_1's max - min is 0
    if rows > 2:
        x[2, :32] = torch.arange(32) / 2 - 8                 # halves: round-away vs round-to-even differ
    return x


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(6))
def test_blocks_equal_llama_cpp_bit_for_bit(kind, seed):
    x = sample(seed + 100 * KINDS.index(kind))
    ref = torch.from_numpy(gguf_quants.quantize(x.numpy(), GGMLQuantizationType[kind]))
    ours = quantize_blocks(x, kind)
    assert ours.shape == ref.shape and ours.dtype == torch.uint8, (kind, ours.shape, ref.shape)
    differ = (ours != ref).sum().item()
    assert differ == 0, f"{kind} codes, shape {tuple(x.shape)}, seed {seed}: {differ} bytes differ from gguf's"
    back = dequantize_blocks(ours, kind)
    want = torch.from_numpy(gguf_quants.dequantize(ref.numpy(), GGMLQuantizationType[kind]))
    assert torch.equal(back, want), f"{kind} dequantized, seed {seed}: max |diff| {(back - want).abs().max():.3g}"


@pytest.mark.parametrize("kind,levels", [("Q8_0", 254), ("Q4_0", 15), ("Q4_1", 15)])
def test_error_is_within_half_a_step_of_each_block(kind, levels):
    """|x - dequantized| <= half the block's step, plus fp16 storage of the scale: the formats'
    contract (Q4_0 maps the block's extreme to -8, so its step is |extreme| / 8 and the other
    end may clip by up to one step)."""
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    err = (dequantize_blocks(quantize_blocks(x, kind), kind) - x).abs().reshape(-1, 32)
    blocks = x.reshape(-1, 32)
    span = blocks.amax(1) - blocks.amin(1) if kind == "Q4_1" else 2 * blocks.abs().amax(1)
    step = span / levels if kind != "Q4_0" else blocks.abs().amax(1) / 8
    bound = (step if kind == "Q4_0" else step / 2) * 1.01 + 1e-3 * blocks.abs().amax(1)
    worst = (err.amax(1) / bound).max().item()
    assert worst <= 1, f"{kind}: a block's error is {worst:.2f} x its bound"


def test_bad_input_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_blocks(torch.zeros(2, 40), "Q8_0")
    with pytest.raises(ValueError, match="kind must be one of"):
        quantize_blocks(torch.zeros(2, 32), "Q5_K")
    with pytest.raises(ValueError, match="whole blocks of 20 bytes"):
        dequantize_blocks(torch.zeros(2, 30, dtype=torch.uint8), "Q4_1")
    with pytest.raises(ValueError, match="uint8"):
        dequantize_blocks(torch.zeros(2, 34), "Q8_0")


def test_layout_low_nibble_is_weight_j_high_nibble_weight_j_plus_16():
    x = torch.cat([torch.full((16,), 0.0), torch.full((16,), 15.0)]).reshape(1, 32)   # Q4_1: d = 1, m = 0
    raw = quantize_blocks(x, "Q4_1")
    assert raw.shape == (1, 20) and raw[0, 4:].tolist() == [0xF0] * 16
    assert np.frombuffer(raw[0, :4].numpy().tobytes(), dtype=np.float16).tolist() == [1.0, 0.0]
