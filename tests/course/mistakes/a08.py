"""Typical mistakes in lab a08: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py). Each is the reference solution with one edit."""
import functools

from tests.course.mistakes import Mistake, solution_edit


_edit = functools.partial(solution_edit, "a08")


MISTAKES = [
    # the query count updated, the kv count forgotten: the layer still splits qkv for every kv head
    Mistake("prune_heads", _edit("prune_heads", "attn.n_heads, attn.n_kv_heads = len(keep), len(groups)",
                                 "attn.n_heads = len(keep)"),
            3, "set both to the kept counts"),
    # the soft term without T^2: its gradient shrinks like 1/T^2
    Mistake("distillation_loss", _edit("distillation_loss", "alpha * temperature ** 2 * kl", "alpha * kl"),
            3, "times T^2"),
    # KL averaged over positions AND the vocabulary: V times too small
    Mistake("distillation_loss", _edit("distillation_loss", 'reduction="batchmean"', 'reduction="mean"'),
            3, "not 'mean'"),
    # every token not kept sent to row 0 (often [PAD]) instead of [UNK]'s row
    Mistake("restrict_vocabulary", _edit("restrict_vocabulary",
                                         "torch.full((V,), int((kept == unk_id).nonzero()), dtype=torch.long)",
                                         "torch.zeros(V, dtype=torch.long)"),
            2, "each goes to [UNK]'s new row"),
]
