"""Byte-level BPE (GPT-2 style), trained from scratch.

Ids 0..255 are the raw bytes, so any UTF-8 text is encodable and `decode(encode(t)) == t`
exactly: emoji, combining marks, CJK. Merges add ids 256, 257, ... in the order they were
learned; special tokens (e.g. "<|endoftext|>") come last. `vocab_size` counts all three.

Text is first cut into pre-tokens by the GPT-2 regex (words with their leading space, numbers,
punctuation runs, whitespace), and merges never cross a pre-token boundary: "dog." and "dog!"
share the token for " dog" instead of learning two. The pattern uses `\\p{L}`/`\\p{N}`, which
only the third-party `regex` module understands; without it we compile the same pattern for
`re` with explicit character classes built from `unicodedata` (letters = categories L*,
numbers = N*, whitespace = the Unicode White_Space list), so both give the same pre-tokens.
`SPLIT_BACKEND` says which one is in use.

Training is the classic algorithm made fast: pairs are counted once per *unique* pre-token,
weighted by its frequency, and after each merge only the words that contain the merged pair are
updated (an index pair -> words), with a lazy max-heap to find the next pair.

Tie-break: among pairs with the same count, the pair with the lexicographically smallest
(left id, right id) wins. It does not depend on the order of the corpus. Hugging Face
`tokenizers` uses the same rule on *its* ids, which order the 256 bytes by their printable
stand-in character (the space byte becomes "Ġ" = U+0120, after all of ASCII): ties between
pairs of printable ASCII break the same way, ties involving space, newline or non-ASCII bytes
may not, and from the first such merge on the two merge lists can drift apart.
"""
from __future__ import annotations

import heapq
import json
import re
import unicodedata
from collections import Counter, defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Iterable

try:
    import regex as _regex_module
except ImportError:  # pragma: no cover - depends on the environment
    _regex_module = None

__all__ = ["ByteBPE", "GPT2_SPLIT_PATTERN", "SPLIT_BACKEND", "compile_split_pattern", "bytes_to_unicode"]

GPT2_SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
SPLIT_BACKEND = "regex" if _regex_module is not None else "re"

# Unicode White_Space property (fixed since Unicode 6.3); `re`'s \s (str.isspace) adds U+001C..1F.
_WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


@lru_cache(maxsize=None)
def _category_class(prefix: str) -> str:
    """A `re` character-class body matching every code point whose category starts with prefix."""
    ranges, start, prev = [], None, None
    for cp in range(0x110000):
        if unicodedata.category(chr(cp)).startswith(prefix):
            if start is None:
                start = cp
            prev = cp
        elif start is not None:
            ranges.append((start, prev))
            start = None
    if start is not None:
        ranges.append((start, prev))
    esc = lambda cp: f"\\U{cp:08x}"  # noqa: E731  - re accepts \UXXXXXXXX inside classes
    return "".join(esc(a) if a == b else f"{esc(a)}-{esc(b)}" for a, b in ranges)


def _gpt2_pattern_for_re() -> str:
    L, N, S = _category_class("L"), _category_class("N"), _WHITE_SPACE
    return (rf"""'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+|[{S}]+(?![^{S}])|[{S}]+""")


def compile_split_pattern(pattern: str = GPT2_SPLIT_PATTERN, backend: str | None = None):
    """Compile the pre-tokenizer with `regex` if installed, else the `re` translation of GPT-2's."""
    if (backend or SPLIT_BACKEND) == "regex":
        return _regex_module.compile(pattern)
    if pattern == GPT2_SPLIT_PATTERN:
        return re.compile(_gpt2_pattern_for_re())
    return re.compile(pattern)  # a custom pattern must then be valid for `re`


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (used by Hugging Face byte-level files).

    Printable Latin-1 bytes stand for themselves; the other 68 get U+0100.. in byte order,
    so the space byte 0x20 is shown as "Ġ". Only needed to exchange merges with `tokenizers`.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _merge_pair(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace every non-overlapping occurrence of pair, scanning left to right."""
    out, i, n = [], 0, len(ids)
    a, b = pair
    while i < n:
        if i < n - 1 and ids[i] == a and ids[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def _learn_merges(word_counts: dict[str, int], n_merges: int) -> list[tuple[int, int]]:
    words = [list(w.encode("utf-8")) for w in word_counts]
    freqs = list(word_counts.values())
    pair_counts: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], set[int]] = defaultdict(set)  # pair -> words that (may) hold it
    for wi, (w, f) in enumerate(zip(words, freqs)):
        for p in zip(w, w[1:]):
            pair_counts[p] += f
            where[p].add(wi)
    # max-heap by count, then smallest pair; entries may be stale (count changed since the push)
    heap = [(-c, p) for p, c in pair_counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[int, int]] = []
    while len(merges) < n_merges and heap:
        neg_count, pair = heapq.heappop(heap)
        count = pair_counts.get(pair, 0)
        if count != -neg_count:  # stale: re-queue with the true count
            if count > 0:
                heapq.heappush(heap, (-count, pair))
            continue
        new_id = 256 + len(merges)
        merges.append(pair)
        touched, grown = set(), set()
        for wi in where.pop(pair):
            old = words[wi]
            new = _merge_pair(old, pair, new_id)
            if len(new) == len(old):  # index entry was stale
                continue
            f = freqs[wi]
            for p in zip(old, old[1:]):
                pair_counts[p] -= f
                touched.add(p)
            for p in zip(new, new[1:]):
                pair_counts[p] += f
                where[p].add(wi)
                grown.add(p)
            words[wi] = new
        for p in touched - grown:  # counts that only fell: their heap entries are stale-high, fixed on pop
            if pair_counts[p] <= 0:
                del pair_counts[p]
        for p in grown:  # counts that may have risen need a fresh entry (extra ones are harmless)
            if pair_counts[p] > 0:
                heapq.heappush(heap, (-pair_counts[p], p))
            else:
                del pair_counts[p]
        pair_counts.pop(pair, None)
    return merges


class ByteBPE:
    """A trained byte-level BPE: `encode`, `decode`, `save`, `load`. Build one with `train`."""

    def __init__(self, merges: Iterable[tuple[int, int]], special_tokens: Iterable[str] = (),
                 pattern: str = GPT2_SPLIT_PATTERN):
        self.merges = [tuple(m) for m in merges]
        self.pattern = pattern
        self._split = compile_split_pattern(pattern)
        self.ranks = {pair: 256 + i for i, pair in enumerate(self.merges)}  # pair -> new id = rank
        self.vocab = [bytes([b]) for b in range(256)]
        for a, b in self.merges:
            self.vocab.append(self.vocab[a] + self.vocab[b])
        self.special_tokens = {s: len(self.vocab) + i for i, s in enumerate(dict.fromkeys(special_tokens))}
        self._special_by_id = {i: s.encode("utf-8") for s, i in self.special_tokens.items()}
        self._special_split = (re.compile("(" + "|".join(map(re.escape, sorted(self.special_tokens, key=len, reverse=True))) + ")")
                               if self.special_tokens else None)
        self._cache: dict[str, list[int]] = {}

    @property
    def vocab_size(self) -> int:
        return 256 + len(self.merges) + len(self.special_tokens)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, special_tokens: Iterable[str] = (),
              pattern: str = GPT2_SPLIT_PATTERN) -> "ByteBPE":
        """Learn vocab_size - 256 - len(special_tokens) merges (fewer if the corpus runs out of pairs)."""
        special_tokens = list(dict.fromkeys(special_tokens))
        n_merges = vocab_size - 256 - len(special_tokens)
        if n_merges < 0:
            raise ValueError(f"vocab_size {vocab_size} < 256 bytes + {len(special_tokens)} special tokens")
        split = compile_split_pattern(pattern)
        cut = re.compile("|".join(map(re.escape, special_tokens))) if special_tokens else None
        word_counts: Counter[str] = Counter()
        for text in texts:
            for part in (cut.split(text) if cut else (text,)):  # never learn merges across a special token
                word_counts.update(split.findall(part))
        return cls(_learn_merges(word_counts, n_merges), special_tokens, pattern)

    def _encode_piece(self, piece: str) -> list[int]:
        ids = self._cache.get(piece)
        if ids is not None:
            return ids
        ids = list(piece.encode("utf-8"))
        ranks = self.ranks
        while len(ids) > 1:
            best = min(zip(ids, ids[1:]), key=lambda p: ranks.get(p, 1 << 62))
            if best not in ranks:
                break
            ids = _merge_pair(ids, best, ranks[best])
        if len(self._cache) < 200_000:  # bounded, so encoding a huge corpus cannot exhaust memory
            self._cache[piece] = ids
        return ids

    def encode(self, text: str, allow_special: bool = True) -> list[int]:
        """Token ids of text. Special token strings map to their ids unless allow_special=False."""
        parts = self._special_split.split(text) if (self._special_split and allow_special) else [text]
        out: list[int] = []
        for k, part in enumerate(parts):
            if k % 2:  # odd parts are the captured special tokens
                out.append(self.special_tokens[part])
                continue
            for piece in self._split.findall(part):
                out.extend(self._encode_piece(piece))
        return out

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """Text of ids. A sequence cut inside a multi-byte character gives U+FFFD (errors='replace')."""
        special, vocab = self._special_by_id, self.vocab
        data = b"".join(special[i] if i in special else vocab[i] for i in ids)
        return data.decode("utf-8", errors=errors)

    def token_bytes(self, i: int) -> bytes:
        return self._special_by_id.get(i) or self.vocab[i]

    def save(self, path: str | Path) -> None:
        state = {"format": "camplib.ByteBPE/1", "pattern": self.pattern,
                 "special_tokens": list(self.special_tokens), "merges": [list(m) for m in self.merges]}
        Path(path).write_text(json.dumps(state))

    @classmethod
    def load(cls, path: str | Path) -> "ByteBPE":
        state = json.loads(Path(path).read_text())
        if state.get("format") != "camplib.ByteBPE/1":
            raise ValueError(f"{path} is not a camplib.ByteBPE file")
        return cls(state["merges"], state["special_tokens"], state["pattern"])
