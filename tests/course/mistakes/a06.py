"""Typical mistakes in lab a06: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py). Each is the reference solution with one edit."""
from autograder.course.reference import solution_cells
from tests.course.mistakes import Mistake


def _edit(grade_id: str, old: str, new: str):
    def make() -> str:
        source = solution_cells("a06")[grade_id]
        if old not in source:
            raise AssertionError(f"a06 mistake: {old!r} is no longer in the solution of {grade_id}")
        return source.replace(old, new)
    return make


MISTAKES = [
    # B drawn at random like A: the model no longer starts as the pretrained one
    Mistake("lora_linear", _edit("lora_linear", "self.lora_B = nn.Parameter(torch.zeros(",
                                 "self.lora_B = nn.Parameter(torch.randn("),
            4, "B starts at zero"),
    # the scale inverted: r / alpha
    Mistake("lora_linear", _edit("lora_linear", "self.scale = alpha / (math.sqrt(r) if use_rslora else r)",
                                 "self.scale = (math.sqrt(r) if use_rslora else r) / alpha"),
            4, "scale = alpha/r"),
    # only the wrapped Linears frozen (by LoRALinear): embeddings, norms and the rest still train
    Mistake("inject_lora", _edit("inject_lora", "    for p in model.parameters():\n        p.requires_grad_(False)\n", ""),
            3, "freeze EVERY parameter"),
]
