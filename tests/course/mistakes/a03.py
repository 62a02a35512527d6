"""Typical mistakes in lab a03: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py)."""
from autograder.course.reference import solution_cells
from tests.course.mistakes import Mistake


def _bias_on_every_rank() -> str:
    """RowParallelLinear adds its bias to the partial product, before g: the sum counts it t times."""
    return solution_cells("a03")["parallel_linear"].replace(
        "        y = ReduceFromTP.apply(F.linear(x, self.weight))\n"
        "        return y + self.bias if self.bias is not None else y",
        "        return ReduceFromTP.apply(F.linear(x, self.weight, self.bias))")


def _softmax_over_local_shard() -> str:
    """The max and the sum of exponentials of this rank's vocabulary shard only (no all-reduce):
    the target logit is found, but the denominator misses every other rank's columns."""
    return solution_cells("a03")["vocab_loss"].replace(
        "        dist.all_reduce(m, op=dist.ReduceOp.MAX)\n", "").replace(
        "sum_exp = ReduceFromTP.apply(shifted.exp().sum(dim=-1))", "sum_exp = shifted.exp().sum(dim=-1)")


MISTAKES = [
    Mistake("parallel_linear", _bias_on_every_rank, 3, "Add the bias once, after the all-reduce"),
    Mistake("vocab_loss", _softmax_over_local_shard, 3, "all-reduce the max (ReduceOp.MAX) and the sum of exponentials"),
]
