"""camp's feedback in nbgrader's release layout: the submission's timestamp.txt and
submission_secret.txt beside the page (what nbgrader's release_feedback hashes), copied with a
byte bound, never through a link, and never left over from an older upload."""
import os

from autograder.reports.feedback import KEY_BYTES, copy_release_keys


def test_keys_are_copied_beside_the_page(tmp_path):
    sub, fb = tmp_path / "collected", tmp_path / "feedback"
    sub.mkdir(), fb.mkdir()
    (sub / "timestamp.txt").write_text("2026-12-04 16:58:50.976868 UTC")
    (sub / "submission_secret.txt").write_text("ab" * 64)
    copy_release_keys(sub, fb)
    assert (fb / "timestamp.txt").read_text() == "2026-12-04 16:58:50.976868 UTC"
    assert (fb / "submission_secret.txt").read_text() == "ab" * 64


def test_a_missing_oversized_or_linked_key_leaves_none(tmp_path):
    sub, fb = tmp_path / "collected", tmp_path / "feedback"
    sub.mkdir(), fb.mkdir()
    (fb / "timestamp.txt").write_text("an older upload's")
    (fb / "submission_secret.txt").write_text("an older upload's")
    (tmp_path / "elsewhere").write_text("not the student's to point at")
    os.symlink(tmp_path / "elsewhere", sub / "timestamp.txt")
    (sub / "submission_secret.txt").write_text("x" * (KEY_BYTES + 1))
    copy_release_keys(sub, fb)
    assert not (fb / "timestamp.txt").exists() and not (fb / "submission_secret.txt").exists()
    os.unlink(sub / "timestamp.txt")
    copy_release_keys(sub, fb)   # absent: nothing, no error
    assert not (fb / "timestamp.txt").exists()
