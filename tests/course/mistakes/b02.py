"""Typical mistakes in lab b02: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py)."""
from tests.course.mistakes import Mistake

# interleaved (GPT-J style) RoPE instead of the half-split convention HF Llama uses
MISTAKES = [
    Mistake("rope", 'def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:\n    """Rotate x (..., T, d) to its positions (T,) with half-split RoPE; same shape and dtype."""\n    d = x.size(-1)\n    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device).float() / d)\n    angles = positions.to(x.device).float()[:, None] * inv_freq[None, :]\n    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)\n    x1, x2 = x[..., 0::2], x[..., 1::2]\n    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)\n', 2, "apply_rope(x, positions=0..4): max |difference|"),
]
