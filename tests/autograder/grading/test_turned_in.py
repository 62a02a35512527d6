"""When an upload was turned in: nbgrader's timestamp.txt when it holds a time, else the upload's
own file time (the lab folder's newest notebook, else the .zip or the student's folder), never
through a link; written back in one format nbgrader reads as the same instant."""
import datetime
import os

import pytest

from autograder.grading.uploads.turned_in import STAMP, read_stamp, record_turned_in, upload_mtime, write_stamp


def _utc(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).replace(tzinfo=None)


def _touch(path, seconds, text="{}"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (seconds, seconds))
    return path


def test_a_lab_folder_is_as_old_as_its_newest_notebook(tmp_path):
    _touch(tmp_path / "ada" / "b01" / "a.ipynb", 1_700_000_000)
    _touch(tmp_path / "ada" / "b01" / "b.ipynb", 1_700_000_500)
    _touch(tmp_path / "ada" / "b01" / "notes.txt", 1_800_000_000)           # not a notebook
    assert upload_mtime(tmp_path, "ada", ("b01_attention", "b01")) == _utc(1_700_000_500)


def test_a_zip_is_as_old_as_the_zip(tmp_path):
    _touch(tmp_path / "bob.zip", 1_600_000_000, "PK")
    assert upload_mtime(tmp_path, "bob", ("b01",)) == _utc(1_600_000_000)


def test_links_are_not_followed(tmp_path):
    _touch(tmp_path / "elsewhere.ipynb", 1_900_000_000)
    (tmp_path / "cy" / "b01").mkdir(parents=True)
    os.symlink(tmp_path / "elsewhere.ipynb", tmp_path / "cy" / "b01" / "x.ipynb")
    os.utime(tmp_path / "cy" / "b01", (1_650_000_000, 1_650_000_000))
    assert upload_mtime(tmp_path, "cy", ("b01",)) == _utc(1_650_000_000)   # the folder's, not the link target's
    os.symlink(tmp_path / "elsewhere.ipynb", tmp_path / "dee.zip")
    before = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) - datetime.timedelta(seconds=1)
    assert upload_mtime(tmp_path, "dee") >= before                            # nothing readable: now


def test_nbgraders_timestamp_wins_and_is_rewritten_in_one_format(tmp_path):
    from nbgrader.utils import parse_utc

    folder = tmp_path / "ws" / "ada" / "b01"
    _touch(folder / STAMP, 1_700_000_000, "2026-01-02 03:04:05.000006+02:00\n")
    when = record_turned_in(folder, tmp_path / "subs", "ada", ("b01",))
    assert when == datetime.datetime(2026, 1, 2, 1, 4, 5, 6)
    assert parse_utc((folder / STAMP).read_text().strip()) == when == read_stamp(folder)   # as nbgrader reads it


@pytest.mark.parametrize("text", ["not a time", "\x1b[2J\u202e", "9" * 200, "2026-13-45 99:99:99", "\xff\xfe"])
def test_a_stamp_without_a_time_gives_way_to_the_uploads_time(tmp_path, text):
    _touch(tmp_path / "subs" / "eve" / "b01" / "a.ipynb", 1_700_000_000)
    folder = tmp_path / "ws" / "eve" / "b01"
    folder.mkdir(parents=True)
    (folder / STAMP).write_bytes(text.encode("utf-8", "surrogateescape") if text != "\xff\xfe" else b"\xff\xfe")
    assert read_stamp(folder) is None
    assert record_turned_in(folder, tmp_path / "subs", "eve", ("b01",)) == _utc(1_700_000_000) == read_stamp(folder)


def test_a_rejected_upload_leaves_only_its_time(tmp_path):
    _touch(tmp_path / "subs" / "fay.zip", 1_710_000_000, "junk")
    folder = tmp_path / "ws" / "fay" / "b01_attention"
    record_turned_in(folder, tmp_path / "subs", "fay", ("b01", "b01_attention"))
    assert [p.name for p in folder.iterdir()] == [STAMP] and read_stamp(folder) == _utc(1_710_000_000)
    write_stamp(folder, datetime.datetime(2027, 1, 1))
    assert read_stamp(folder) == datetime.datetime(2027, 1, 1)
