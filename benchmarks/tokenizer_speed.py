"""Benchmark: train a 4k byte-level BPE on a few MB of the stdlib, camplib vs Hugging Face `tokenizers`.

Side by side, on the same text: training seconds (and the ratio), compression (bytes per token)
of both on held-out files (the validation split of `camplib.data.split_files`), encoding speed,
and how the two merge lists compare (identical leading merges, shared merges).

  .venv/bin/python benchmarks/tokenizer_speed.py [--mb 4] [--vocab 4096] [--val-mb 1]
"""
from __future__ import annotations

import argparse
import json
import time

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from camplib.data import read_corpus, split_files, stdlib_files
from camplib.tokenizer import SPLIT_BACKEND, ByteBPE, bytes_to_unicode


def take_mb(paths, mb: float) -> list[str]:
    texts, size = [], 0
    for text in read_corpus(paths):
        if size >= mb * 1e6:
            break
        texts.append(text)
        size += len(text.encode())
    return texts


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def train_hf(texts: list[str], vocab_size: int) -> Tokenizer:
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return hf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=4.0, help="MB of training text")
    ap.add_argument("--val-mb", type=float, default=1.0, help="MB of held-out text")
    ap.add_argument("--vocab", type=int, default=4096)
    args = ap.parse_args()

    train_files, val_files = split_files(stdlib_files())
    train, val = take_mb(train_files, args.mb), take_mb(val_files, args.val_mb)
    n_train, n_val = sum(len(t.encode()) for t in train), sum(len(t.encode()) for t in val)
    print(f"train: {len(train)} files, {n_train / 1e6:.2f} MB; held-out: {len(val)} files, {n_val / 1e6:.2f} MB; "
          f"vocab {args.vocab}; pre-tokenizer backend: {SPLIT_BACKEND}")

    ours, t_ours = timed(lambda: ByteBPE.train(train, args.vocab))
    hf, t_hf = timed(lambda: train_hf(train, args.vocab))
    ours_ids, e_ours = timed(lambda: [ours.encode(t) for t in val])
    hf_ids, e_hf = timed(lambda: [e.ids for e in hf.encode_batch(val)])
    bpt_ours = n_val / sum(map(len, ours_ids))
    bpt_hf = n_val / sum(map(len, hf_ids))

    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    as_bytes = lambda s: bytes(to_byte[c] for c in s)  # noqa: E731
    hf_merges = [tuple(m.split(" ")) if isinstance(m, str) else m for m in json.loads(hf.to_str())["model"]["merges"]]
    theirs = [(as_bytes(a), as_bytes(b)) for a, b in hf_merges]
    mine = [(ours.vocab[a], ours.vocab[b]) for a, b in ours.merges]
    same_prefix = next((i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y), min(len(mine), len(theirs)))

    print(f"{'':12s}{'train s':>10s}{'encode s':>10s}{'bytes/token':>13s}")
    print(f"{'camplib':12s}{t_ours:10.2f}{e_ours:10.2f}{bpt_ours:13.4f}")
    print(f"{'tokenizers':12s}{t_hf:10.2f}{e_hf:10.2f}{bpt_hf:13.4f}")
    print(f"train time ratio camplib/tokenizers: {t_ours / t_hf:.2f}x; "
          f"compression ratio camplib/tokenizers: {bpt_ours / bpt_hf:.4f}")
    print(f"merges: {len(mine)} vs {len(theirs)}; identical leading merges: {same_prefix}; "
          f"shared merges (as byte pairs): {len(set(mine) & set(theirs))}")


if __name__ == "__main__":
    main()
