"""Typical mistakes in lab b06: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py)."""
from autograder.course.reference import solution_cells
from tests.course.mistakes import Mistake

MISTAKES = [
    # averaging twice: the bucket is divided by N before the all-reduce and again after it
    Mistake("data_parallel", lambda: solution_cells("b06")["data_parallel"].replace(
        "flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])",
        "flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]]) / self.world_size"), 3, "averaged twice?"),
    # every rank keeps its own random initial weights
    Mistake("data_parallel", lambda: solution_cells("b06")["data_parallel"].replace(
        "        broadcast_parameters(module)\n", ""), 3, "did you broadcast them?"),
]
