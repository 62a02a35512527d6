"""`camp start LAB`: a personal copy of the released lab that nothing of the course overwrites."""
import subprocess

import pytest

from autograder.catalog import Catalog, repo_root
from autograder.cli import main
from autograder.course.start import WORK_DIR, StartError, start_lab

ROOT = repo_root()


def test_start_copies_the_released_lab_and_never_overwrites(tmp_path, capsys):
    assert main(["start", "b01", "--into", str(tmp_path)]) == 0
    copy = tmp_path / "b01_attention" / "b01_attention.ipynb"
    released = Catalog.load().get("b01").release_path(ROOT)
    assert copy.read_bytes() == released.read_bytes()
    assert str(copy) in capsys.readouterr().out                     # it says where

    copy.write_text("my work")                                       # the student's edits
    assert main(["start", "b01_attention", "--into", str(tmp_path)]) == 1
    assert "already exists" in capsys.readouterr().err
    assert copy.read_text() == "my work"


def test_the_default_folder_is_git_ignored():
    lab = Catalog.load().get("b01")
    path = f"{WORK_DIR}/{lab.name}/{lab.notebook}"
    ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
    assert ignored.returncode == 0, f"{path} must be git-ignored: git pull and commits never touch it"
    assert not (ROOT / "labs").resolve().is_relative_to((ROOT / WORK_DIR).resolve())


def test_a_lab_not_released_yet_is_refused(tmp_path):
    lab = Catalog.load().get("b01")
    empty = tmp_path / "repo"
    (empty / "labs").mkdir(parents=True)
    with pytest.raises(StartError, match="not released"):
        start_lab(lab, empty, tmp_path / "work")
    assert not (tmp_path / "work").exists()


def test_nbgraders_fetch_lands_in_the_same_personal_folder():
    """The lab's Assignments tab (nbgrader fetch) copies a released lab where `camp start` does."""
    from autograder.course.nbgrader_setup import instructor_config

    assert instructor_config(ROOT).Exchange.assignment_dir == str(ROOT / WORK_DIR)
