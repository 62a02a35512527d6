"""`make hub`'s pieces that need no hub: what is closed to students, what must stay reachable,
each role's nbgrader settings, Debian's proxy under another node. (The class itself runs in a
browser: tests/browser/test_hub_in_browser.py.)"""
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from autograder.course import hub
from autograder.course.nbgrader_setup import COURSE_ID


def test_everything_but_what_students_need_is_private(tmp_path, monkeypatch):
    for name in (".venv", "camplib", "autograder", "course", "labs", "solutions", ".git", "runs", "tests"):
        (tmp_path / name).mkdir()
    (tmp_path / "README.md").write_text("")
    monkeypatch.setenv("CAMP_GRADING_DIR", str(tmp_path / "elsewhere" / "grading"))
    private = hub.private_folders(tmp_path)
    assert {p.name for p in private} == {"solutions", ".git", "runs", "tests", "grading"}
    assert tmp_path.resolve() / "elsewhere" / "grading" in private
    monkeypatch.setenv("CAMP_GRADING_DIR", "grading")   # inside the repository: listed once
    (tmp_path / "grading").mkdir()
    assert [p.name for p in hub.private_folders(tmp_path)].count("grading") == 1


@pytest.fixture
def open_tmp():
    """A folder every user can enter (pytest's own tmp_path sits in a 0700 folder)."""
    path = Path(tempfile.mkdtemp(prefix="camp-hub-test-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_folder_students_cannot_enter_is_named(open_tmp, monkeypatch):
    tmp_path = open_tmp
    repo = tmp_path / "private" / "repo"
    (repo / "camplib").mkdir(parents=True)
    monkeypatch.setattr(sys, "base_prefix", str(tmp_path))   # the course's Python: reachable
    os.chmod(tmp_path / "private", 0o700)
    try:
        assert hub.unreachable(repo) == tmp_path / "private"
        os.chmod(tmp_path / "private", 0o711)   # enter, not list: enough
        os.chmod(repo / "camplib", 0o700)
        assert hub.unreachable(repo) == repo / "camplib"
        os.chmod(repo / "camplib", 0o755)
        assert hub.unreachable(repo) is None
    finally:
        os.chmod(tmp_path / "private", 0o755)


def test_the_course_python_counts_too(open_tmp, monkeypatch):
    tmp_path = open_tmp
    (tmp_path / "home").mkdir(mode=0o700)
    monkeypatch.setattr(sys, "base_prefix", str(tmp_path / "home" / "pyenv"))
    (tmp_path / "home" / "pyenv").mkdir()
    assert hub.unreachable(tmp_path) == tmp_path / "home"


@pytest.mark.parametrize("role", ["student", "instructor"])
def test_each_role_gets_the_class_exchange(role, monkeypatch, tmp_path):
    monkeypatch.setenv("CAMP_HUB_ROLE", role)
    monkeypatch.setenv("CAMP_EXCHANGE_DIR", str(tmp_path / "exchange"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    c = hub.nbgrader_hub_config()
    assert c.Exchange.root == str(tmp_path / "exchange")
    assert c.Exchange.path_includes_course is True and c.CourseDirectory.course_id == COURSE_ID
    assert c.ExchangeFactory.release_feedback == "autograder.course.exchange_feedback.ReleaseFeedback"
    if role == "student":
        assert c.Exchange.assignment_dir == str(tmp_path / "home")
        assert "source_directory" not in c.CourseDirectory
    else:
        assert c.CourseDirectory.source_directory == "solutions"   # Formgrader's course


def test_the_default_exchange_is_the_shared_one(monkeypatch, tmp_path):
    monkeypatch.delenv("CAMP_EXCHANGE_DIR", raising=False)
    assert hub.hub_exchange(tmp_path) == Path("/srv/nbgrader/exchange")


def test_debian_proxy_gets_its_module_folder(monkeypatch, tmp_path):
    fake = tmp_path / "configurable-http-proxy"
    fake.symlink_to("/usr/share/nodejs/configurable-http-proxy/bin/configurable-http-proxy")
    monkeypatch.setattr(hub.shutil, "which", lambda name: str(fake))
    monkeypatch.setenv("NODE_PATH", "/opt/mine")
    hub.proxy_environment()
    assert os.environ["NODE_PATH"] == "/opt/mine:/usr/share/nodejs"
    hub.proxy_environment()   # idempotent
    assert os.environ["NODE_PATH"] == "/opt/mine:/usr/share/nodejs"
    monkeypatch.setattr(hub.shutil, "which", lambda name: "/usr/local/bin/configurable-http-proxy")   # npm's: untouched
    monkeypatch.setenv("NODE_PATH", "")
    hub.proxy_environment()
    assert os.environ["NODE_PATH"] == ""
