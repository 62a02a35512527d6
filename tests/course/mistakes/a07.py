"""Typical mistakes in lab a07: each must lose exactly its exercise's points, with a message that
helps (graded by tests/course/test_labs.py). Each is the reference solution with one edit."""
import functools

from tests.course.mistakes import Mistake, solution_edit


_edit = functools.partial(solution_edit, "a07")


MISTAKES = [
    # the zero point added after clamping: codes leave [0, 2^b - 1] (and wrap in uint8) when a calibrated scale clips
    Mistake("int_formats", _edit("int_formats", "q = torch.clamp(torch.round(x / scale) + zero, 0, qmax)",
                                 "q = torch.clamp(torch.round(x / scale), 0, qmax) + zero"),
            3, "then clamp"),
    # nibbles in the wrong order: the first code of a pair in the low nibble
    Mistake("int4_packing", _edit("int4_packing", "return (c[..., 0::2] << 4) | c[..., 1::2]",
                                  "return c[..., 0::2] | (c[..., 1::2] << 4)"),
            2, "high nibble"),
    # the block's max instead of its absmax: a block whose largest magnitude is negative is scaled wrongly
    Mistake("nf4", _edit("nf4", "absmax = blocks.abs().amax(dim=1)", "absmax = blocks.amax(dim=1)"),
            3, "largest |value|"),
]
