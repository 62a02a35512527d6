"""The grade sheet's message says why a submission lost its points, in the grader's own words:
the whole submission's reason, else the cells that could not run, then each distinct test
message with the tests that got it; one line, bounded, nothing for a full score."""
import pytest

from autograder.grading.results import SubmissionResult
from autograder.grading.results import TestOutcome as Outcome
from autograder.reports.reasons import MAX_REASON, lost_points

FORBIDDEN = "your code called torch.nn.functional.scaled_dot_product_attention, which this lab forbids"


def _result(*tests, message="", cell_errors=()):
    return SubmissionResult("ada", "b01", "graded" if not message else "error", sum(t.score for t in tests),
                            sum(t.points for t in tests), list(tests), list(cell_errors), message=message)


def test_full_marks_have_no_reason():
    assert lost_points(_result(Outcome("test_a", 2, 2), Outcome("test_b", 4, 4))) == ""


def test_each_reason_is_named_with_the_tests_that_lost_points_for_it():
    r = _result(Outcome("test_a", 2, 2), Outcome("test_b", 4, 0, FORBIDDEN + "\nsecond line"),
                Outcome("test_c", 4, 0, FORBIDDEN), Outcome("test_d", 2, 0, "timed out after 120 s"),
                Outcome("test_e", 2, 1, "attn: max difference 0.5 at (0, 1) > atol 1e-5 "
                                         "[this run's hidden cases used seed 1234]"))
    assert lost_points(r) == (f"test_b, test_c: {FORBIDDEN}; test_d: timed out after 120 s; "
                              "test_e: attn: max difference 0.5 at (0, 1) > atol 1e-5")


def test_cells_that_could_not_run_come_first_then_the_tests():
    r = _result(Outcome("test_a", 2, 0, "NameError: name 'softmax' is not defined"),
                cell_errors=["cell 7: timed out after 120 s (the cell was skipped)", "cell 9: exited (signal 9)",
                             "cell 11: MemoryError"])
    assert lost_points(r) == ("cell 7: timed out after 120 s (the cell was skipped); cell 9: exited (signal 9) "
                              "(+1 more cells); test_a: NameError: name 'softmax' is not defined")


def test_cell_errors_alone_do_not_make_a_full_score_look_lost():
    assert lost_points(_result(Outcome("test_a", 2, 2), cell_errors=["cell 3: ValueError: demo"])) == ""


@pytest.mark.parametrize("why", ["not a valid notebook: Notebook JSON is invalid",
                                 "not run: your code imports torch.nn.functional.scaled_dot_product_attention",
                                 "zip entry 'a/../../x' escapes the folder", "grader error: boom"])
def test_the_whole_submissions_reason_wins(why):
    assert lost_points(_result(Outcome("test_a", 2, 0, "not graded: ..."), message=why + "\ndetails")) == why


def test_a_silent_zero_still_says_so_and_the_line_is_bounded():
    assert lost_points(_result(Outcome("test_a", 2, 0, ""))) == "test_a: no points"
    long = _result(*[Outcome(f"test_{i}", 1, 0, f"reason {i} " + "x" * 80) for i in range(20)])
    assert len(lost_points(long)) == MAX_REASON
