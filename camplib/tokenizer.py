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

Tie-break: when several pairs share the highest count, which one is merged is a convention, and
from the first tie broken differently two merge lists drift apart. `train(tie_break=...)`:
- "tokenizers" (the default): the rule of Hugging Face `tokenizers`' BpeTrainer, the trainer
  behind most published BPE vocabularies (RoBERTa, BLOOM, Falcon, StarCoder...): the pair with
  the smallest (left id, right id) in *its* vocabulary order, where the 256 bytes are ordered by
  their GPT-2 printable stand-in character (`bytes_to_unicode`: "!".."~" first, the space byte
  "Ġ" = U+0120 late) and merged tokens by when they were learned. Its BinaryHeap compares equal
  counts by `other.pair.cmp(&self.pair)`; tests/camplib/test_tokenizer.py checks our merge list
  equals BpeTrainer's exactly.
- "greatest_bytes": the lexicographically greater pair of byte strings (left bytes, then right
  bytes), the published rule of Stanford CS336's BPE assignment and its reference tests;
  checked against a naive trainer written from that definition.
- "smallest_ids": the smallest pair of our ids (bytes by value, then merge order). The simplest
  to state and the rule lab b03 teaches; camplib's default before.
(Trainers that take Python's `max(counts, key=counts.get)`, like minbpe and tiktoken's
educational trainer, break ties by first occurrence in the corpus: an order, not a rule.)

Streaming: `encode_iterable` encodes a text given in pieces (an open file) lazily, with the same
ids as `encode` on the whole text, however the pieces are cut.
"""
from __future__ import annotations

import heapq
import json
import re
import unicodedata
from collections import Counter, defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Iterator

try:
    import regex as _regex_module
except ImportError:  # pragma: no cover - depends on the environment
    _regex_module = None

__all__ = ["ByteBPE", "TIE_BREAKS", "GPT2_SPLIT_PATTERN", "SPLIT_BACKEND", "compile_split_pattern", "bytes_to_unicode"]

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


TIE_BREAKS = ("tokenizers", "greatest_bytes", "smallest_ids")
_STAND_IN_RANK = {b: r for r, b in enumerate(sorted(range(256), key=lambda b: bytes_to_unicode()[b]))}


class _Descending:
    """Wraps a key so that a min-heap pops the *greatest* first (for "greatest_bytes")."""
    __slots__ = ("key",)

    def __init__(self, key):
        self.key = key

    def __lt__(self, other: "_Descending") -> bool:
        return self.key > other.key

    def __eq__(self, other) -> bool:
        return self.key == other.key


def _tie_key(tie_break: str, vocab: list[bytes]):
    """key(pair) whose *smallest* value wins among pairs of equal count."""
    if tie_break == "smallest_ids":
        return lambda pair: pair
    if tie_break == "tokenizers":
        rank = lambda i: _STAND_IN_RANK[i] if i < 256 else i  # noqa: E731  merged ids all follow the bytes
        return lambda pair: (rank(pair[0]), rank(pair[1]))
    if tie_break == "greatest_bytes":
        return lambda pair: _Descending((vocab[pair[0]], vocab[pair[1]]))
    raise ValueError(f"tie_break must be one of {TIE_BREAKS}, got {tie_break!r}")


def _learn_merges(word_counts: dict[str, int], n_merges: int, tie_break: str = "tokenizers") -> list[tuple[int, int]]:
    vocab = [bytes([b]) for b in range(256)]  # id -> bytes, grown as merges are learned
    tie_key = _tie_key(tie_break, vocab)
    words = [list(w.encode("utf-8")) for w in word_counts]
    freqs = list(word_counts.values())
    pair_counts: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], set[int]] = defaultdict(set)  # pair -> words that (may) hold it
    for wi, (w, f) in enumerate(zip(words, freqs)):
        for p in zip(w, w[1:]):
            pair_counts[p] += f
            where[p].add(wi)
    # max-heap by count, then the tie-break key; entries may be stale (count changed since the push)
    heap = [(-c, tie_key(p), p) for p, c in pair_counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[int, int]] = []
    while len(merges) < n_merges and heap:
        neg_count, key, pair = heapq.heappop(heap)
        count = pair_counts.get(pair, 0)
        if count != -neg_count:  # stale: re-queue with the true count
            if count > 0:
                heapq.heappush(heap, (-count, key, pair))
            continue
        new_id = 256 + len(merges)
        merges.append(pair)
        vocab.append(vocab[pair[0]] + vocab[pair[1]])
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
                heapq.heappush(heap, (-pair_counts[p], tie_key(p), p))
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
              pattern: str = GPT2_SPLIT_PATTERN, tie_break: str = "tokenizers") -> "ByteBPE":
        """Learn vocab_size - 256 - len(special_tokens) merges (fewer if the corpus runs out of pairs).

        tie_break: which of equally frequent pairs is merged, "tokenizers" (Hugging Face's
        BpeTrainer), "greatest_bytes" (CS336) or "smallest_ids" (lab b03): see the module docstring.
        """
        if tie_break not in TIE_BREAKS:
            raise ValueError(f"tie_break must be one of {TIE_BREAKS}, got {tie_break!r}")
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
        return cls(_learn_merges(word_counts, n_merges, tie_break), special_tokens, pattern)

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

    # A GPT-2 pre-token is decided by its own characters, the one after it (the lookahead of
    # `\s+(?!\S)`, the char that ends a greedy run) and at most 3 from its start (the failed
    # literals 's 't 're 've 'm 'll 'd). So once the text extends 2 characters past its end, more
    # text cannot change it (nor any pre-token before it).
    _SETTLED_MARGIN = 2

    def encode_iterable(self, texts: Iterable[str], allow_special: bool = True) -> Iterator[int]:
        """Ids of "".join(texts), yielded lazily: identical to `encode` on the whole text, while
        holding only the current chunk plus the unsettled tail (usually one pre-token) in memory.

        Pass an open text file (it yields lines) to tokenize a corpus larger than memory. Chunks
        may end anywhere, even inside a word, a contraction, a run of spaces or a special token:
        a pre-token is emitted only once the text past it can no longer change where it ends,
        and a special token only once no longer special token could still start at its place.
        Memory is bounded by the longest pre-token (a 1 GB line of letters is one pre-token).
        The margin argument holds for GPT-2's pattern; a custom `pattern` that looks further
        ahead needs a larger `_SETTLED_MARGIN`.
        """
        specials = self._special_split if (self._special_split is not None and allow_special) else None
        longest_special = max(map(len, self.special_tokens), default=0) if specials else 0
        buffer = ""
        for chunk in texts:
            if not isinstance(chunk, str):
                raise TypeError(f"encode_iterable needs str chunks, got {type(chunk).__name__}")
            buffer += chunk
            while specials is not None:  # settled special tokens: flush the text before, emit the id
                m = specials.search(buffer)
                if m is None or m.start() + longest_special > len(buffer):
                    break  # none, or a longer special token might still begin here
                yield from self.encode(buffer[:m.start()], allow_special=False)
                yield self.special_tokens[m.group()]
                buffer = buffer[m.end():]
            # where a special token could still begin, the text before it is not settled either
            limit = len(buffer) - (longest_special - 1 if specials is not None else 0)
            m = specials.search(buffer) if specials is not None else None
            if m is not None:
                limit = min(limit, m.start())
            done = 0
            for piece in self._split.finditer(buffer, 0, max(0, limit)):
                if piece.end() + self._SETTLED_MARGIN > limit:
                    break
                yield from self._encode_piece(piece.group())
                done = piece.end()
            buffer = buffer[done:]
        yield from self.encode(buffer, allow_special=allow_special)

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
