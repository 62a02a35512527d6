"""Typical mistakes in project p02: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py). Each is the reference solution with one edit."""
import functools

from tests.course.mistakes import Mistake, solution_edit


_edit = functools.partial(solution_edit, "p02")


MISTAKES = [
    # every message trained: the model also learns to write the user's side
    Mistake("encode_chat", _edit("encode_chat", 'trained = 1 if m["role"] == "assistant" else 0', "trained = 1"),
            3, "train only the assistant's tokens"),
    # the end-of-turn token left out of the mask: the model never learns to stop
    Mistake("encode_chat", _edit("encode_chat", '(m["content"] + IM_END, trained), ("\\n", 0)',
                                 '(m["content"], trained), (IM_END + "\\n", 0)'),
            3, "the end-of-turn token must be in the mask"),
    # padding labelled with pad_id (== <|im_end|>) instead of -100: padding is trained
    Mistake("pad_batch", _edit("pad_batch", "labels = torch.full((B, T), -100, dtype=torch.long)",
                               "labels = torch.full((B, T), pad_id, dtype=torch.long)"),
            2, "padding positions need label -100"),
]
