"""The tensors behind the block manager: keys and values of every layer for `num_blocks` blocks
of `block_size` token slots, (layers, blocks, slots, kv_heads, head_dim), allocated once.

`write` scatters new keys/values to their (block, slot); `gather` reads the blocks of a batch of
block tables back into the contiguous (B, kv_heads, S, head_dim) layout attention expects, with
a key mask hiding the slots past each sequence's length (a GPU engine would read the blocks
inside the attention kernel instead; on CPU a gather is the readable way).
"""
from __future__ import annotations

import torch

from camplib.memory import storage_bytes

__all__ = ["PagedKVPool", "pool_bytes_per_block"]


def pool_bytes_per_block(cfg, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block costs over all layers, keys and values: sizes the pool from a memory budget."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.n_layer * block_size * cfg.kv_heads * cfg.head_dim * itemsize


class PagedKVPool:
    def __init__(self, cfg, num_blocks: int, block_size: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None):
        shape = (cfg.n_layer, num_blocks, block_size, cfg.kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.block_size = block_size

    @property
    def nbytes(self) -> int:
        return storage_bytes([self.k, self.v])

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor, slots: torch.Tensor) -> None:
        """k, v: (N, kv_heads, head_dim) for N tokens going to blocks[i], slots[i]."""
        self.k[layer, blocks, slots] = k.to(self.k.dtype)
        self.v[layer, blocks, slots] = v.to(self.v.dtype)

    def gather(self, layer: int, tables: torch.Tensor, lengths: torch.Tensor):
        """tables (B, max_blocks) (padded with any valid block), lengths (B,) -> keys, values
        (B, kv_heads, max_blocks * block_size, head_dim) and the key mask (B, 1, 1, S), True
        for the slots each sequence really filled."""
        B, nb = tables.shape
        k = self.k[layer][tables].reshape(B, nb * self.block_size, *self.k.shape[-2:]).transpose(1, 2)
        v = self.v[layer][tables].reshape(B, nb * self.block_size, *self.v.shape[-2:]).transpose(1, 2)
        mask = torch.arange(nb * self.block_size, device=tables.device)[None, :] < lengths[:, None]
        return k, v, mask[:, None, None, :]
