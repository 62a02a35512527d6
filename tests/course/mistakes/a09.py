"""Typical mistakes in lab a09: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py)."""
import functools

from tests.course.mistakes import Mistake, solution_edit


_edit = functools.partial(solution_edit, "a09")


# the max grew but the running sum keeps the terms summed under the old max (acc is rescaled)
NO_RESCALE_OF_THE_SUM = _edit("online_softmax", "alpha * l + p.sum(dim=-1)", "l + p.sum(dim=-1)")

# the causal mask built from tile-local row numbers: right in the first query tile only
CAUSAL_MASK_WITHOUT_TILE_OFFSET = _edit("online_softmax",
                                        "rows = torch.arange(q_start, q_start + bq, device=q_tile.device)[:, None]",
                                        "rows = torch.arange(0, bq, device=q_tile.device)[:, None]")

# the softmax backward without D = rowsum(dO * O): dS = P * dP
BACKWARD_WITHOUT_D = _edit("flash_backward", "ds = p * (dp - D[..., r0:r1, None])", "ds = p * dp")

MISTAKES = [
    Mistake("online_softmax", NO_RESCALE_OF_THE_SUM, 4, "rescale the running sum"),
    Mistake("online_softmax", CAUSAL_MASK_WITHOUT_TILE_OFFSET, 4, "absolute position q_start + r"),
    Mistake("flash_backward", BACKWARD_WITHOUT_D, 4, "D = rowsum(dO * O)"),
]
