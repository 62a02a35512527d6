"""Typical mistakes in lab a05: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py)."""
import functools

from tests.course.mistakes import Mistake, solution_edit


_edit = functools.partial(solution_edit, "a05")


MISTAKES = [
    # column-major: the FIRST dimension of order varies fastest (dp neighbours instead of tp)
    Mistake("mesh", _edit("mesh", "for dim in reversed(order):", "for dim in order:"), 2, "row-major"),
    # the "strided" split: chunks rank and rank + cp (every position once, but the work is unbalanced)
    Mistake("zigzag", _edit("zigzag", "first, second = rank, 2 * cp - 1 - rank", "first, second = rank, rank + cp"),
            2, "2cp-1-rank"),
    # ring attention without the causal offset between shards: a lower-triangular mask on local indices
    Mistake("causal_block", _edit("causal_block", "mask = q_pos[:, None] >= k_pos[None, :]",
                                  "mask = torch.ones(len(q_pos), len(k_pos), dtype=torch.bool).tril()"),
            3, "GLOBAL positions"),
    # partial softmaxes merged with the running max instead of the log-sum-exp of both denominators
    Mistake("ring_forward", _edit("ring_forward", "new_lse = torch.logaddexp(lse, block_lse)",
                                  "new_lse = torch.maximum(lse, block_lse)"), 4, "log-sum-exp"),
    # each rank's part of the batch with the strided split (chunks r and r + cp): every token once, but the model
    # embeds them at the zig-zag positions and ring attention masks by them, so the loss is not one process's
    Mistake("local_batch", _edit("local_batch", "(2 * cp - 1 - cp_rank) * size, (2 * cp - cp_rank) * size",
                                 "(cp_rank + cp) * size, (cp_rank + cp + 1) * size"), 3, "zig-zag chunks"),
]
