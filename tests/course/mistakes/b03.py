"""Typical mistakes in lab b03: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py)."""
from tests.course.mistakes import Mistake

# BPE merges learned over the whole text, across pre-token (word) boundaries
MISTAKES = [
    Mistake("train_bpe", 'def train_bpe(text: str, vocab_size: int) -> list[tuple[int, int]]:\n    """Merges [(a, b), ...] learned from text (merge k creates id 256 + k), at most vocab_size - 256."""\n    words, freqs = [list(text.encode("utf-8"))], [1]\n    merges = []\n    while 256 + len(merges) < vocab_size:\n        counts = get_pair_counts(words, freqs)\n        if not counts:\n            break\n        a, b, _ = min(counts, key=lambda t: (-t[2], t[0], t[1]))\n        merges.append((a, b))\n        words = [merge_word(w, (a, b), 256 + len(merges) - 1) for w in words]\n    return merges\n', 3, "merges never cross a pre-token boundary"),
]
