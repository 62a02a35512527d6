"""Typical mistakes in lab b01: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py). A larger b01 round trip (broken notebooks,
feedback, the report, resuming) is tests/autograder/grading/test_grade.py."""
from tests.course.mistakes import Mistake

# a causal mask aligned top-left (torch's is_causal convention) instead of bottom-right
TOP_LEFT_MASKS = '''
def causal_mask(L, S=None, device=None):
    S = L if S is None else S
    return torch.ones(L, S, dtype=torch.bool, device=device).tril()

def padding_mask(lengths, S):
    return (torch.arange(S, device=lengths.device)[None, :] < lengths[:, None])[:, None, None, :]
'''

MISTAKES = [
    Mistake("masks", TOP_LEFT_MASKS, 2, "causal_mask"),
]
