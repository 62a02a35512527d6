"""`sudo camp grade` into a workspace its instructors share (setgid folder of their group, as
`make hub` makes it): what root wrote is given that group with read and write, links untouched;
in any other workspace nothing changes."""
import grp
import os
import stat
import subprocess
import uuid

import pytest

from autograder.grading.uploads import share_with_group
from tests.support import not_run


@pytest.fixture
def group():
    if os.geteuid() != 0:   # loud: a skip with the reason and a warning, a failure under CI (which runs as root)
        message = "SHARED WORKSPACE TEST NOT RUN: needs root (only root's files are handed to the instructors' group)"
        not_run(message)
    name = f"campt{uuid.uuid4().hex[:6]}"
    subprocess.run(["groupadd", name], check=True)
    try:
        yield grp.getgrnam(name).gr_gid
    finally:
        subprocess.run(["groupdel", name], check=False)


def test_roots_files_join_the_instructors_group(tmp_path, group):
    ws = tmp_path / "grading"
    (ws / "feedback" / "ada").mkdir(parents=True)
    page = ws / "feedback" / "ada" / "b01.html"
    page.write_text("x")
    os.chmod(page, 0o600)
    os.symlink("/etc/passwd", ws / "link")
    os.chown(ws, 0, group)
    os.chmod(ws, 0o2770)
    share_with_group(ws)
    assert os.stat(page).st_gid == group and stat.S_IMODE(os.stat(page).st_mode) == 0o660
    folder = os.stat(ws / "feedback" / "ada")
    assert folder.st_gid == group and folder.st_mode & stat.S_ISGID and folder.st_mode & 0o070 == 0o070
    assert os.stat("/etc/passwd").st_gid == 0 and os.lstat(ws / "link").st_gid == 0


def test_a_private_workspace_is_left_alone(tmp_path, group):
    ws = tmp_path / "grading"
    ws.mkdir()
    (ws / "gradebook.db").write_text("x")
    os.chmod(ws, 0o700)
    share_with_group(ws)
    assert os.stat(ws / "gradebook.db").st_gid == 0
    os.chown(ws, 0, group)   # a group, but not setgid: not shared
    share_with_group(ws)
    assert os.stat(ws / "gradebook.db").st_gid == 0
