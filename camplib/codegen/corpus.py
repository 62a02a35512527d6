"""The code corpus: Python standard-library files, split by camplib.data, cut into chunks,
tokenized by a byte-level BPE (camplib.tokenizer) that knows the FIM sentinels.

Why chunks: a FIM example is only useful when prefix, suffix and middle fit in one context
window; a 2000-line module cut into 128-token blocks would put them in different blocks. So
files are first cut at line boundaries into pieces of at most `chunk_chars` characters, FIM is
applied per piece, and pieces are packed (camplib.data.pack) with an end-of-text id after each.

Which files: top-level stdlib modules (no packages, no tests), ordered by sha256 of their name,
so the first n are a varied, machine-independent sample; the train/validation side of each file
comes from camplib.data.split_files (hash of the path), never from this order.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from camplib.codegen.sentinels import EOT, SPECIAL_TOKENS
from camplib.data import pack, read_corpus, split_files, stdlib_files, stdlib_root
from camplib.tokenizer import ByteBPE

__all__ = ["EOT", "SPECIAL_TOKENS", "CodeCorpus", "load_corpus", "chunk_lines", "train_tokenizer", "encode_blocks"]



@dataclass
class CodeCorpus:
    train: list[str]      # chunks of training files
    val: list[str]        # chunks of held-out files (never seen in training or by the tokenizer)
    train_files: list[str]
    val_files: list[str]


def chunk_lines(text: str, chunk_chars: int) -> list[str]:
    """Consecutive runs of whole lines, each at most chunk_chars long (a longer line is cut);
    joined, they give back the text exactly. Blank-only chunks are dropped."""
    if chunk_chars < 1:
        raise ValueError(f"chunk_chars must be >= 1, got {chunk_chars}")
    chunks, current = [], ""
    for line in text.splitlines(keepends=True):
        while len(line) > chunk_chars:  # a very long line: cut it (rare in the stdlib)
            if current:
                chunks.append(current)
                current = ""
            chunks.append(line[:chunk_chars])
            line = line[chunk_chars:]
        if len(current) + len(line) > chunk_chars:
            chunks.append(current)
            current = ""
        current += line
    if current:
        chunks.append(current)
    return [c for c in chunks if c.strip()]


def _top_level_modules() -> list:
    root = stdlib_root()
    files = [p for p in stdlib_files(root) if p.parent == root]
    return sorted(files, key=lambda p: hashlib.sha256(p.name.encode()).hexdigest())


def load_corpus(n_train_files: int, n_val_files: int, chunk_chars: int = 256,
                max_file_chars: int = 60_000) -> CodeCorpus:
    """The first n_train_files training and n_val_files validation modules (files longer than
    max_file_chars skipped, to keep small runs small), chunked."""
    train_paths, val_paths = split_files(_top_level_modules(), val_fraction=0.1)
    pick = lambda paths, n: [p for p in paths if p.stat().st_size <= max_file_chars][:n]  # noqa: E731
    train_paths, val_paths = pick(train_paths, n_train_files), pick(val_paths, n_val_files)
    if len(val_paths) < n_val_files or len(train_paths) < n_train_files:
        raise ValueError(f"only {len(train_paths)} training and {len(val_paths)} validation modules fit")
    chunk = lambda paths: [c for doc in read_corpus(paths) for c in chunk_lines(doc, chunk_chars)]  # noqa: E731
    return CodeCorpus(chunk(train_paths), chunk(val_paths), [p.name for p in train_paths], [p.name for p in val_paths])


def train_tokenizer(texts: Sequence[str], vocab_size: int) -> ByteBPE:
    """Byte-level BPE with vocab_size ids in all: 256 bytes, merges, then the 4 special tokens."""
    return ByteBPE.train(texts, vocab_size, special_tokens=SPECIAL_TOKENS)


def encode_blocks(bpe: ByteBPE, docs: Sequence[str], block_size: int,
                  transform: Callable[[list[str]], list[str]] | None = None) -> torch.Tensor:
    """(n_blocks, block_size + 1) ids: docs (after `transform`, e.g. FIM) encoded with their
    sentinels as special ids, an end-of-text after each, packed by camplib.data.pack."""
    docs = list(transform(list(docs)) if transform is not None else docs)
    return pack([bpe.encode(d, allow_special=True) for d in docs], block_size, bpe.special_tokens[EOT])
