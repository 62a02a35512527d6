"""Typical mistakes in lab b05: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py)."""
from tests.course.mistakes import Mistake

# top-p that drops the token crossing the threshold (> instead of >=)
MISTAKES = [
    Mistake("top_p", 'def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:\n    """Nucleus filtering: keep the smallest set of most likely tokens whose probabilities sum to\n    >= p (always at least the most likely one), set the other logits to -inf.\n    Raises ValueError unless 0 <= p <= 1."""\n    if not 0.0 <= p <= 1.0:\n        raise ValueError(f"top_p must be in [0, 1], got {p}")\n    if p >= 1.0:\n        return logits\n    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)\n    probs = sorted_logits.float().softmax(dim=-1)\n    drop_sorted = probs.cumsum(dim=-1) > p\n    drop_sorted[..., 0] = False\n    drop = drop_sorted.scatter(-1, order, drop_sorted)\n    return logits.masked_fill(drop, float("-inf"))\n', 2, "the token that crosses p"),
]
