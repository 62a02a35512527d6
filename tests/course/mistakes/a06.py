"""Typical mistakes in lab a06: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py). Each is the reference solution with one edit."""
import functools

from tests.course.mistakes import Mistake, solution_edit


_edit = functools.partial(solution_edit, "a06")


MISTAKES = [
    # B drawn at random like A: the model no longer starts as the pretrained one, and the
    # fine-tuned MiniLM (the outcome test, 2 points) starts from a scrambled encoder too
    Mistake("lora_linear", _edit("lora_linear", "self.lora_B = nn.Parameter(torch.zeros(",
                                 "self.lora_B = nn.Parameter(torch.randn("),
            4 + 2, "B starts at zero"),
    # the scale inverted: r / alpha
    Mistake("lora_linear", _edit("lora_linear", "self.scale = alpha / (math.sqrt(r) if use_rslora else r)",
                                 "self.scale = (math.sqrt(r) if use_rslora else r) / alpha"),
            4, "scale = alpha/r"),
    # only the wrapped Linears frozen (by LoRALinear): embeddings, norms and the rest still train
    Mistake("inject_lora", _edit("inject_lora", "    for p in model.parameters():\n        p.requires_grad_(False)\n", ""),
            3, "freeze EVERY parameter"),
]
