"""The README's `make test` claim is machine-readable, and compared the way the suite compares it."""
import pytest

from tests.readme_claims import CLAIM, compare, full_run, readme_claim


def test_the_readme_states_a_count_and_a_range_between_markers():
    count, low, high = readme_claim()
    assert count > 0 and 0 < low <= high


def test_a_wrong_count_is_a_problem_and_time_only_a_note():
    assert compare((100, 15, 16), 100, 15.5) == ("", "")
    problem, note = compare((100, 15, 16), 101, 15.5)
    assert "says 100 tests, this run ran 101" in problem and note == ""
    problem, note = compare((100, 15, 16), 100, 19.2)
    assert problem == "" and "this run took 19.2" in note


@pytest.mark.parametrize("args, keyword, markexpr, expected", [
    ([], "", "", True), (["tests"], "", "", True), (["tests/"], "", "", True),
    (["tests/autograder"], "", "", False), ([], "softmax", "", False), ([], "", "not slow", False),
])
def test_only_a_full_run_is_compared(args, keyword, markexpr, expected):
    assert full_run(args, keyword, markexpr, ["tests"]) is expected


def test_a_readme_without_the_claim_is_an_error(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("1089 tests in 15-16 minutes")
    with pytest.raises(ValueError, match="no"):
        readme_claim(readme)
    readme.write_text("<!-- make-test -->12 tests in 1-2 minutes<!-- /make-test -->")
    assert readme_claim(readme) == (12, 1.0, 2.0) and CLAIM.pattern


@pytest.mark.slow
def test_a_full_run_with_another_count_fails_under_ci():
    """The hook in tests/conftest.py, end to end: a 'full run' of this one file (testpaths set to
    it) ran far fewer tests than the README claims, so under CI the run fails and says why."""
    import os
    import subprocess
    import sys

    from autograder.catalog import repo_root

    me = "tests/test_readme_claims.py"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-o", f"testpaths={me}",
           me, "-k", "not full_run_with"]   # -k makes it a partial run: not compared
    env = {**os.environ, "CI": "true"}
    partial = subprocess.run(cmd, cwd=repo_root(), env=env, capture_output=True, text=True, timeout=300)
    assert partial.returncode == 0 and "README CLAIM" not in partial.stdout, partial.stdout
    full = subprocess.run(cmd[:-2] + ["--deselect", f"{me}::test_a_full_run_with_another_count_fails_under_ci"],
                          cwd=repo_root(), env=env, capture_output=True, text=True, timeout=300)
    assert full.returncode == 1, full.stdout
    assert f"README.md says {readme_claim()[0]} tests, this run ran" in full.stdout, full.stdout
