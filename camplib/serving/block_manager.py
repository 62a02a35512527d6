"""Paged KV-cache bookkeeping (vLLM's PagedAttention, Kwon et al. 2023): the cache is a pool of
fixed-size blocks of `block_size` token slots, and each sequence owns a *block table*, the list of
its blocks in order. Token t of a sequence lives in block table[t // block_size], slot
t % block_size.

Why blocks: a contiguous cache per request must reserve max_seq_len slots up front, so most of
it sits empty (short answers) and a batch fits few requests. With blocks a sequence holds at most
one partly filled block, and a finished or abandoned request gives its blocks straight back to
the pool for the next one. This class only does the accounting (which block belongs to whom);
the tensors live in `camplib.serving.kv_pool.PagedKVPool`.
"""
from __future__ import annotations

__all__ = ["BlockManager", "OutOfBlocks"]


class OutOfBlocks(RuntimeError):
    """No free block is left: the scheduler must wait, preempt or refuse."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_blocks: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2...
        self.tables: dict[int, list[int]] = {}    # sequence id -> its blocks, in token order
        self.lengths: dict[int, int] = {}         # sequence id -> tokens it has slots for

    def blocks_needed(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)  # ceil

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    @property
    def blocks_in_use(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def can_allocate(self, n_tokens: int) -> bool:
        return self.blocks_needed(n_tokens) <= self.num_free

    def allocate(self, seq_id: int, n_tokens: int) -> list[int]:
        """Give a new sequence the blocks for its first n_tokens (its prompt); its block table."""
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id} already has blocks {self.tables[seq_id]}")
        need = self.blocks_needed(n_tokens)
        if need > self.num_free:
            raise OutOfBlocks(f"sequence {seq_id} needs {need} blocks for {n_tokens} tokens, {self.num_free} free")
        self.tables[seq_id] = [self.free_blocks.pop() for _ in range(need)]
        self.lengths[seq_id] = n_tokens
        return self.tables[seq_id]

    def needs_new_block(self, seq_id: int) -> bool:
        """Whether one more token would start a new block (its last block is full)."""
        return self.lengths[seq_id] % self.block_size == 0

    def append(self, seq_id: int) -> int:
        """Make room for one more token of a sequence; the (block, slot) it goes to. Takes a new
        block only when the last one is full."""
        table, n = self.tables[seq_id], self.lengths[seq_id]
        if n == len(table) * self.block_size:
            if not self.free_blocks:
                raise OutOfBlocks(f"sequence {seq_id} needs a new block at token {n}, none free")
            table.append(self.free_blocks.pop())
        self.lengths[seq_id] = n + 1
        return table[n // self.block_size], n % self.block_size

    def free(self, seq_id: int) -> int:
        """Return all blocks of a sequence to the pool (finished, aborted or preempted); how many.
        Freeing an unknown or already freed sequence is a no-op, so abort paths may race."""
        table = self.tables.pop(seq_id, [])
        self.lengths.pop(seq_id, None)
        self.free_blocks.extend(reversed(table))
        return len(table)

    def slots(self, seq_id: int, start: int, end: int) -> list[tuple[int, int]]:
        """(block, slot) of tokens start..end-1 of a sequence, which must already have slots."""
        table = self.tables[seq_id]
        if end > self.lengths[seq_id]:
            raise ValueError(f"sequence {seq_id} has slots for {self.lengths[seq_id]} tokens, asked up to {end}")
        return [(table[t // self.block_size], t % self.block_size) for t in range(start, end)]

    def usage(self) -> dict[str, float]:
        """Blocks in use, free, and the fraction used (vLLM's kv cache usage)."""
        return {"blocks_in_use": self.blocks_in_use, "blocks_free": self.num_free,
                "usage": self.blocks_in_use / self.num_blocks}
