"""The paged KV cache's accounting: blocks handed out per sequence, one more only when the last
is full, all returned on free, and a clear error when the pool is empty."""
import pytest

from camplib.serving.block_manager import BlockManager, OutOfBlocks


def test_allocate_append_free_counts_blocks():
    bm = BlockManager(num_blocks=6, block_size=4)
    assert bm.allocate(0, 5) == [0, 1] and bm.blocks_in_use == 2      # 5 tokens -> 2 blocks of 4
    assert bm.append(0) == (1, 1)                                      # token 5 -> block 1, slot 1
    bm.append(0); bm.append(0)                                         # tokens 6, 7 fill block 1
    assert bm.blocks_in_use == 2 and bm.needs_new_block(0)
    assert bm.append(0) == (2, 0) and bm.tables[0] == [0, 1, 2]        # token 8 opens block 2
    bm.allocate(1, 1)
    assert bm.usage() == {"blocks_in_use": 4, "blocks_free": 2, "usage": 4 / 6}
    assert bm.slots(0, 3, 6) == [(0, 3), (1, 0), (1, 1)]
    assert bm.free(0) == 3 and bm.blocks_in_use == 1
    assert bm.free(0) == 0, "freeing twice must be a no-op (abort may race with finish)"
    assert bm.free(1) == 1 and bm.blocks_in_use == 0 and sorted(bm.free_blocks) == list(range(6))


def test_out_of_blocks_is_a_clear_error_and_changes_nothing():
    bm = BlockManager(num_blocks=2, block_size=2)
    bm.allocate(0, 4)
    assert not bm.can_allocate(1)
    with pytest.raises(OutOfBlocks, match="needs 1 blocks"):
        bm.allocate(1, 1)
    with pytest.raises(OutOfBlocks, match="none free"):
        bm.append(0)
    assert bm.blocks_in_use == 2 and bm.lengths[0] == 4 and 1 not in bm.tables
    with pytest.raises(ValueError, match="already has blocks"):
        bm.allocate(0, 1)
    with pytest.raises(ValueError):
        BlockManager(0, 4)
