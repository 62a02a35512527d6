"""camplib.parallel.context.ring: ring attention on cp gloo ranks equals full causal attention
(torch's SDPA) forward and backward, for the zig-zag and the contiguous split; the zig-zag split
balances the work; per-rank attention memory shrinks as 1/cp^2 of the full (T x T) scores.

Tolerances: fp64 atol 1e-12, rtol 1e-10 (blocks merged by log-sum-exp in another order than one
softmax); fp32 atol 1e-5, rtol 1e-4.
"""
import pytest
import torch
import torch.nn.functional as F

from camplib.attention import scaled_dot_product_attention
from camplib.parallel.context.ring import (
    block_attention,
    join_sequence,
    merge_partial,
    ring_attention,
    split_positions,
    split_sequence,
    unmasked_entries,
)
from camplib.parallel.context.run import largest_full_attention_bytes, run_ring_attention
from tests.support import assert_close

TOL = {torch.float64: dict(atol=1e-12, rtol=1e-10), torch.float32: dict(atol=1e-5, rtol=1e-4)}


def _inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=dtype) for _ in range(4)]


def _reference(q, k, v, grad_out):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=True)
    out.backward(grad_out)
    return {"out": out.detach(), "grad_q": leaves[0].grad, "grad_k": leaves[1].grad, "grad_v": leaves[2].grad}


def test_zigzag_positions_pair_first_and_last_chunks():
    assert split_positions(8, 0, 2).tolist() == [0, 1, 6, 7]
    assert split_positions(8, 1, 2).tolist() == [2, 3, 4, 5]
    assert split_positions(8, 1, 2, "contiguous").tolist() == [4, 5, 6, 7]
    every = torch.cat([split_positions(24, r, 3) for r in range(3)])
    assert sorted(every.tolist()) == list(range(24))


def test_split_and_join_are_inverse():
    x = torch.randn(2, 3, 12, 4)
    for split in ("zigzag", "contiguous"):
        assert torch.equal(join_sequence([split_sequence(x, r, 3, split) for r in range(3)], split), x)


def test_bad_split_sizes_name_the_numbers():
    with pytest.raises(ValueError, match=r"seq_len=10 is not divisible by 8 \(zigzag split over cp=4\)"):
        split_positions(10, 0, 4)
    with pytest.raises(ValueError, match="split='ring'"):
        split_positions(8, 0, 2, "ring")


def test_zigzag_balances_the_work_and_contiguous_does_not():
    zig = [unmasked_entries(64, r, 4, "zigzag") for r in range(4)]
    contiguous = [unmasked_entries(64, r, 4, "contiguous") for r in range(4)]
    assert len(set(zig)) == 1 and sum(zig) == 64 * 65 // 2, zig
    assert sum(contiguous) == sum(zig) and contiguous == sorted(contiguous) and contiguous[-1] > 5 * contiguous[0]


def test_blocks_merged_by_lse_equal_one_softmax():
    """Keys cut into blocks, merged block by block by log-sum-exp, give full causal attention."""
    q, k, v, _ = _inputs((2, 3, 12, 4), torch.float64)
    pos = torch.arange(12)
    out, lse = block_attention(q, k, v, pos, pos)
    expected = scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_close("one block", out, expected, **TOL[torch.float64])
    out, lse = block_attention(q, k[:, :, :1], v[:, :, :1], pos, pos[:1])   # key 0: every query sees one
    for idx in [torch.arange(1, 5), torch.arange(5, 12)]:
        out, lse = merge_partial(out, lse, *block_attention(q, k[:, :, idx], v[:, :, idx], pos, pos[idx]))
    assert_close("merged blocks", out, expected, **TOL[torch.float64])


@pytest.mark.parametrize("cp, split, dtype", [(2, "zigzag", torch.float64), (4, "zigzag", torch.float64),
                                              (4, "contiguous", torch.float64), (2, "zigzag", torch.float32)])
def test_ring_attention_equals_full_attention_forward_and_backward(cp, split, dtype):
    q, k, v, grad_out = _inputs((2, 3, 16, 8), dtype)
    got = run_ring_attention(lambda a, b, c: ring_attention(a, b, c, split=split), q, k, v, cp, grad_out, split=split)
    expected = _reference(q, k, v, grad_out)
    for key in expected:
        assert_close(f"{key} (cp={cp}, {split}, {dtype})", got[key], expected[key], **TOL[dtype])


def test_ring_attention_sends_each_block_around_the_ring():
    """Forward: cp-1 hops of (k, v); backward: cp-1 hops of (k, v, dk, dv) plus one home hop of (dk, dv)."""
    cp = 4
    q, k, v, grad_out = _inputs((1, 2, 16, 4), torch.float64)
    got = run_ring_attention(ring_attention, q, k, v, cp, grad_out)
    block = 2 * q[:, :, : 16 // cp].numel() * 8   # k and v of one shard, fp64
    assert got["bytes_sent"] == [(cp - 1) * block + (cp - 1) * 2 * block + block] * cp


def test_ring_attention_memory_per_rank_is_a_block_not_the_sequence():
    """The largest tensor a rank creates in forward + backward vs one process's plain attention,
    which builds the (T x T) scores: 1/cp^2 of it at cp = 4 (the block's scores)."""
    cp, T = 4, 64
    q, k, v, grad_out = _inputs((1, 2, T, 4), torch.float64)
    full = largest_full_attention_bytes(lambda a, b, c: scaled_dot_product_attention(a, b, c, is_causal=True),
                                        q, k, v, grad_out)
    got = run_ring_attention(ring_attention, q, k, v, cp, grad_out)
    assert full == 2 * T * T * 8, full
    assert got["largest_bytes"] == [full // cp**2] * cp, (got["largest_bytes"], full)


def test_ring_attention_refuses_mismatched_shapes():
    q = torch.randn(1, 4, 8, 4)
    with pytest.raises(ValueError, match="repeat GQA heads"):
        ring_attention(q, q[:, :2], q[:, :2])


def _forward_with(block):
    def forward(q, k, v, positions, ring):
        out = lse = None
        for step in range(ring.size):
            src = (ring.rank - step) % ring.size
            b_out, b_lse = block(q, k, v, positions[ring.rank], positions[src])
            out, lse = (b_out, b_lse) if out is None else merge_partial(out, lse, b_out, b_lse)
            if step < ring.size - 1:
                k, v = ring.pass_on(k, v)
        return out
    return forward


def _local_causal_block(q, k, v, q_pos, k_pos):
    """The typical mistake: a lower-triangular mask on every block (local indices, no offset)."""
    local = torch.arange(len(q_pos))
    return block_attention(q, k, v, local, local)


def test_ring_forward_runner_tells_the_causal_offset_from_none():
    q, k, v, _ = _inputs((1, 2, 16, 4), torch.float64)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    from camplib.parallel.context.run import run_ring_forward
    good = run_ring_forward(_forward_with(block_attention), q, k, v, 4)
    assert_close("ring forward, course block", good["out"], expected, **TOL[torch.float64])
    assert good["bytes_sent"] == [3 * 2 * q[:, :, :4].numel() * 8] * 4
    bad = run_ring_forward(_forward_with(_local_causal_block), q, k, v, 4)
    assert (bad["out"] - expected).abs().max() > 0.1
