"""From source files to training batches: corpus, split, de-duplication, packing, sharded loading.

The course's text is the Python standard library (`sysconfig.get_paths()["stdlib"]`, *.py).
Every step is deterministic and machine-independent, so two students (or two ranks) that run it
get the same split, the same duplicates removed and the same batches:
- the train/val split hashes each file's path *relative to the stdlib root* (sha256), not the
  order of a directory listing or a seeded RNG;
- exact duplicates are found by sha256 of the normalised content;
- near duplicates by MinHash + LSH (universal hashing with fixed seeds, blake2b shingle hashes,
  never Python's per-process salted `hash`);
- `pack` concatenates documents separated by an end-of-text id and cuts fixed-size blocks;
- `make_loader` gives each rank a disjoint shard exactly like `DistributedSampler`, and can
  resume mid-epoch from a batch index;
- `get_batch` is the other way pre-training code samples (nanoGPT, the CS336 assignments): B
  random windows of one long token array, which may be a memory-mapped file larger than RAM.
"""
from __future__ import annotations

import hashlib
import os
import sysconfig
from collections import defaultdict
from itertools import combinations
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

__all__ = ["stdlib_root", "stdlib_files", "split_files", "read_corpus", "dedup_exact", "shingles", "MinHash",
           "estimate_jaccard", "lsh_params", "near_duplicates", "pack", "BlockDataset",
           "ShardSampler", "make_loader", "get_batch"]


# ---------------------------------------------------------------- corpus and split

def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """All *.py files under root (default: this Python's stdlib), sorted by relative path.

    site-packages (installed third-party code, not the stdlib) and __pycache__ are skipped.
    """
    root = Path(root) if root is not None else stdlib_root()
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in ("site-packages", "__pycache__")]  # prune
        found += [Path(folder, n) for n in names if n.endswith(".py")]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def _unit_hash(key: str) -> float:
    """sha256 of key as a number in [0, 1): the same on every machine and every run."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2.0 ** 64


def split_files(paths: Sequence[str | Path], val_fraction: float = 0.05,
                root: str | Path | None = None) -> tuple[list[Path], list[Path]]:
    """(train, val): a file is in val iff sha256(its path relative to root) < val_fraction.

    root defaults to the stdlib root when all paths are under it (else their common folder), so
    a file lands on the same side whatever subset of files is split, on any machine.
    """
    paths = [Path(p) for p in paths]
    if root is None:
        std = stdlib_root()
        root = std if all(p.is_relative_to(std) for p in paths) else Path(os.path.commonpath(paths)) if paths else std
    train, val = [], []
    for p in paths:
        (val if _unit_hash(p.relative_to(root).as_posix()) < val_fraction else train).append(p)
    return train, val


def read_corpus(paths: Iterable[str | Path]) -> list[str]:
    """Text of each file (UTF-8; the rare undecodable byte becomes U+FFFD rather than an error)."""
    return [Path(p).read_text(encoding="utf-8", errors="replace") for p in paths]


# ---------------------------------------------------------------- exact duplicates

def _normalise(doc: str) -> str:
    # Trailing whitespace (per line and at the end) and \r\n vs \n are invisible in an editor and
    # change nothing in Python, so they do not make two files different. Everything else does.
    lines = doc.replace("\r\n", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).rstrip()


def dedup_exact(docs: Sequence[str]) -> tuple[list[str], list[int]]:
    """(kept docs, indices removed): keep the first of each group with equal normalised content."""
    seen, kept, removed = set(), [], []
    for i, doc in enumerate(docs):
        key = hashlib.sha256(_normalise(doc).encode("utf-8")).digest()
        if key in seen:
            removed.append(i)
        else:
            seen.add(key)
            kept.append(doc)
    return kept, removed


# ---------------------------------------------------------------- MinHash + LSH

def shingles(text: str, k: int = 5) -> set[str]:
    """Word k-grams (words = whitespace-separated runs), so re-indenting or re-wrapping is free.

    A text with fewer than k words gives one shingle (the words it has); an empty text none.
    """
    words = text.split()
    if len(words) < k:
        return {" ".join(words)} if words else set()
    return {" ".join(words[i:i + k]) for i in range(len(words) - k + 1)}


_P = (1 << 61) - 1  # Mersenne prime: x mod p needs only shifts and masks
_M32 = np.uint64(0xFFFFFFFF)


def _mod_p(x: np.ndarray) -> np.ndarray:
    x = (x & np.uint64(_P)) + (x >> np.uint64(61))  # 2^61 = 1 (mod p)
    return np.where(x >= np.uint64(_P), x - np.uint64(_P), x)


def _mulmod_p(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(a * x) mod (2^61 - 1) for a, x < 2^61 without overflowing uint64 (32-bit limbs)."""
    ah, al = a >> np.uint64(32), a & _M32
    xh, xl = x >> np.uint64(32), x & _M32
    high = ah * xh                                # < 2^58, weight 2^64 = 8 (mod p)
    mid = ah * xl + al * xh                       # < 2^62, weight 2^32
    low = al * xl                                 # < 2^64
    mid_term = (mid >> np.uint64(29)) + ((mid & np.uint64((1 << 29) - 1)) << np.uint64(32))  # mid*2^32 mod p
    total = _mod_p(low) + _mod_p(mid_term) + (high << np.uint64(3))
    return _mod_p(total)  # total < 2^63: one fold and one subtraction suffice


def _shingle_hashes(items: Iterable[str]) -> np.ndarray:
    """64-bit blake2b of each shingle, reduced mod p (deterministic, unlike Python's hash)."""
    h = [int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest(), "little") for s in items]
    return _mod_p(np.array(h, dtype=np.uint64))


class MinHash:
    """num_perm hash functions h_i(x) = (a_i x + b_i) mod p; the signature is min_x h_i(x) per i.

    P[min h_i(A) == min h_i(B)] = |A & B| / |A | B| (Jaccard), so the fraction of equal signature
    entries estimates it with standard error sqrt(J (1 - J) / num_perm).
    """

    def __init__(self, num_perm: int = 128, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.num_perm = num_perm
        self.a = rng.integers(1, _P, size=num_perm, dtype=np.uint64)
        self.b = rng.integers(0, _P, size=num_perm, dtype=np.uint64)

    def signature(self, shingle_set: Iterable[str], chunk: int = 4096) -> np.ndarray:
        """uint64 array (num_perm,); an empty set gives all p (matches only other empty sets)."""
        x = _shingle_hashes(shingle_set)
        sig = np.full(self.num_perm, _P, dtype=np.uint64)
        for start in range(0, len(x), chunk):  # chunks bound memory at num_perm * chunk * 8 bytes
            xs = x[None, start:start + chunk]
            values = _mod_p(_mulmod_p(self.a[:, None], xs) + self.b[:, None])
            sig = np.minimum(sig, values.min(axis=1))
        return sig

    def __call__(self, text: str, k: int = 5) -> np.ndarray:
        return self.signature(shingles(text, k))


def estimate_jaccard(sig1: np.ndarray, sig2: np.ndarray) -> float:
    return float(np.mean(np.asarray(sig1) == np.asarray(sig2)))


def lsh_params(num_perm: int, threshold: float) -> tuple[int, int]:
    """(bands, rows) with bands*rows == num_perm whose S-curve midpoint (1/b)^(1/r) is closest
    to threshold but not above it, so pairs at the threshold are rarely missed."""
    options = [(b, num_perm // b) for b in range(1, num_perm + 1) if num_perm % b == 0]
    below = [(b, r) for b, r in options if (1 / b) ** (1 / r) <= threshold] or options
    return min(below, key=lambda br: threshold - (1 / br[0]) ** (1 / br[1]))


def near_duplicates(docs: Sequence[str], threshold: float = 0.8, bands: int | None = None,
                    rows: int | None = None, num_perm: int = 128, k: int = 5,
                    seed: int = 0) -> list[tuple[int, int]]:
    """Sorted pairs (i, j), i < j, whose estimated Jaccard of word k-gram shingles >= threshold.

    LSH: signatures are cut into `bands` bands of `rows` rows; two docs become candidates when any
    band matches exactly (probability 1 - (1 - J^r)^b), so only candidates are compared instead of
    all n^2 pairs. Candidates are then kept only if their full-signature estimate passes.
    """
    if bands is None or rows is None:
        bands, rows = lsh_params(num_perm, threshold)
    num_perm = bands * rows
    mh = MinHash(num_perm, seed)
    sigs = [mh(doc, k) for doc in docs]
    candidates = set()
    for band in range(bands):
        buckets = defaultdict(list)
        for i, sig in enumerate(sigs):
            buckets[sig[band * rows:(band + 1) * rows].tobytes()].append(i)
        for members in buckets.values():
            candidates.update(combinations(members, 2))
    return sorted(p for p in candidates if estimate_jaccard(sigs[p[0]], sigs[p[1]]) >= threshold)


# ---------------------------------------------------------------- packing and loading

def pack(token_lists: Iterable[Sequence[int]], block_size: int, eos_id: int) -> torch.Tensor:
    """LongTensor (n_blocks, block_size + 1) from doc0 eos doc1 eos ... cut every block_size tokens.

    Consecutive blocks overlap by one token (block k = stream[k*T : k*T + T + 1]), so with
    inputs = block[:-1] and targets = block[1:] every token of the stream but the first is a
    target exactly once; only the tail shorter than a block is dropped.
    """
    stream = []
    for tokens in token_lists:
        stream.extend(tokens)
        stream.append(eos_id)
    stream = torch.tensor(stream, dtype=torch.long)
    n_blocks = max(0, (len(stream) - 1) // block_size)
    if n_blocks == 0:
        return torch.empty(0, block_size + 1, dtype=torch.long)
    return stream[: n_blocks * block_size + 1].unfold(0, block_size + 1, block_size).contiguous()


class BlockDataset(Dataset):
    """Item i of packed blocks as (inputs, targets) = (block[:-1], block[1:])."""

    def __init__(self, blocks: torch.Tensor):
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        block = self.blocks[i]
        return block[:-1], block[1:]


class ShardSampler(Sampler):
    """Indices of one rank's shard: the same order as `DistributedSampler` for the same seed,
    epoch, world_size and drop_last, plus a `start` offset into the shard for resuming.

    Shuffle with a generator seeded by seed + epoch (every rank draws the same permutation), pad
    by repeating the first indices (or drop the tail) to a multiple of world_size, then rank r
    takes positions r, r + world_size, ...: disjoint shards that together cover every index.
    """

    def __init__(self, n: int, rank: int = 0, world_size: int = 1, seed: int = 0, epoch: int = 0,
                 shuffle: bool = True, drop_last: bool = False, start: int = 0):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} not in [0, {world_size})")
        self.n, self.rank, self.world_size, self.seed, self.epoch = n, rank, world_size, seed, epoch
        self.shuffle, self.drop_last, self.start = shuffle, drop_last, start

    def shard(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=g).tolist()
        else:
            order = list(range(self.n))
        if self.drop_last:
            order = order[: self.n - self.n % self.world_size]
        else:
            total = -(-self.n // self.world_size) * self.world_size
            while len(order) < total:  # repeat from the start (more than once if n is tiny)
                order += order[: total - len(order)]
        return order[self.rank::self.world_size]

    def __iter__(self):
        return iter(self.shard()[self.start:])

    def __len__(self) -> int:
        return max(0, len(self.shard()) - self.start)


def make_loader(blocks: torch.Tensor, batch_size: int, rank: int = 0, world_size: int = 1,
                seed: int = 0, epoch: int = 0, shuffle: bool = True, start_batch: int = 0,
                drop_last: bool = False, num_workers: int = 0) -> DataLoader:
    """DataLoader of (inputs, targets) batches for one rank, deterministic given seed and epoch.

    start_batch=k skips the first k batches of this epoch (saved in a checkpoint, it resumes the
    run exactly where it stopped). drop_last drops the shard tail that cannot fill a whole
    world_size (as DistributedSampler does); the last batch of a shard may still be short.
    """
    sampler = ShardSampler(len(blocks), rank, world_size, seed, epoch, shuffle, drop_last,
                           start=start_batch * batch_size)
    return DataLoader(BlockDataset(blocks), batch_size=batch_size, sampler=sampler, num_workers=num_workers)


def get_batch(tokens, batch_size: int, context_length: int, device: str | torch.device = "cpu",
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), both int64 (batch_size, context_length) on `device`: B windows of
    `tokens` starting at uniformly random offsets, targets shifted by one token.

    `tokens` is a 1-D numpy array, an `np.memmap` of a token file, or a tensor. Offsets are drawn
    from `generator` (a CPU torch.Generator; the global RNG when None), so a seeded generator
    gives the same batches on every machine. Only the B windows are read: on a memmap the
    operating system pages in those few kilobytes, never the file, so the file can be far
    larger than memory (tests/camplib/test_data.py samples a 4 GiB file under a 256 MiB limit).

    Unlike `pack` + `make_loader` (fixed, non-overlapping blocks, each seen once per epoch),
    windows may overlap and repeat, and every offset is possible: there is no epoch, the usual
    regime of pre-training, where the corpus is seen about once anyway.
    """
    if getattr(tokens, "ndim", 1) != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tuple(tokens.shape)}")
    if batch_size < 1 or context_length < 1:
        raise ValueError(f"batch_size and context_length must be >= 1, got {batch_size}, {context_length}")
    n = len(tokens)
    if n < context_length + 1:
        raise ValueError(f"{n} tokens cannot fill a window of context_length + 1 = {context_length + 1}")
    starts = torch.randint(0, n - context_length, (batch_size,), generator=generator)  # s + T <= n - 1
    if isinstance(tokens, torch.Tensor):
        windows = tokens[starts[:, None] + torch.arange(context_length + 1)].long()
    else:  # numpy array or memmap: fancy indexing copies just these B * (T + 1) elements
        index = starts.numpy()[:, None] + np.arange(context_length + 1)
        windows = torch.from_numpy(np.asarray(tokens[index]).astype(np.int64))
    x, y = windows[:, :-1], windows[:, 1:]
    device = torch.device(device)
    if device.type == "cuda":  # pinned host memory lets the copy overlap with compute
        x, y = x.contiguous().pin_memory(), y.contiguous().pin_memory()
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    return x.contiguous().to(device), y.contiguous().to(device)
