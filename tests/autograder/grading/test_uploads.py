"""Reading submissions treats input as hostile: every class of malformed upload (zip structure,
names, trees, sizes, notebook content, special files) is one student's clear error, never a
crash, a hang or a file outside the scratch folder, and the caps come from course/labs.toml."""
import json
import os
import socket
import stat
import textwrap
import time
import zipfile

import pytest

from autograder.catalog import Catalog, CatalogError, GradingCaps
from autograder.grading.uploads import (
    SubmissionError,
    check_notebook,
    collect,
    copy_plain_files,
    remove_tree,
)

NB = json.dumps({"cells": [{"cell_type": "code", "id": "c1", "source": "x = 1", "metadata": {}, "outputs": [],
                            "execution_count": None}],
                 "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
SMALL = GradingCaps(notebook_bytes=4096, cell_bytes=1024, files=20, total_bytes=8192, path_depth=4, name_bytes=40,
                    zip_ratio=20, json_depth=16)


def _nb(path, text=NB):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text) if isinstance(text, str) else path.write_bytes(text)
    return path


def _zip(path, entries, **kw):
    """A zip of {name: bytes}; `kw` sets ZipInfo attributes on every entry."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            for k, v in kw.items():
                setattr(info, k, v)
            z.writestr(info, data)
    return path


def _patch(path, local_offset, central_offset, value):
    """Set a 2-byte header field of every entry (zipfile's writer resets flags and methods)."""
    data = bytearray(path.read_bytes())
    for sig, offset in ((b"PK\x03\x04", local_offset), (b"PK\x01\x02", central_offset)):
        at = data.find(sig)
        while at >= 0:
            data[at + offset:at + offset + 2] = value.to_bytes(2, "little")
            at = data.find(sig, at + 4)
    path.write_bytes(bytes(data))


def _reasons(subs, tmp_path, caps=GradingCaps()):
    found, rejected = collect(subs, tmp_path / "scratch", caps)
    return found, {r.student: r.reason for r in rejected}


def test_folders_and_zips(tmp_path):
    subs = tmp_path / "subs"
    _nb(subs / "alice" / "b01_attention" / "b01_attention.ipynb")
    _zip(subs / "bob.zip", {"b01_attention/b01_attention.ipynb": NB})           # zip of the lab folders
    _zip(subs / "carol.zip", {"carol/b01/b01_attention.ipynb": NB, "__MACOSX/carol/._x": "junk"})  # whole folder
    found, rejected = collect(subs, tmp_path / "scratch")
    assert rejected == []
    assert [(s.student, s.lab) for s in found] == [("alice", "b01_attention"), ("bob", "b01_attention"), ("carol", "b01")]
    assert all((s.path / "b01_attention.ipynb").read_text() == NB for s in found)
    assert all(str(s.path).startswith(str(tmp_path / "scratch")) for s in found), "later steps read the checked copy"


def test_ids_links_and_non_folders_are_rejected_per_student(tmp_path):
    subs = tmp_path / "subs"
    _nb(subs / "good" / "b01" / "b01_attention.ipynb")
    (subs / "broken.zip").write_bytes(b"not a zip")
    (subs / "bad id!").mkdir()
    (subs / "=cmd|calc").mkdir()
    (subs / "notes.txt").write_text("hello")                  # a student "folder" that is a file
    os.mkfifo(subs / "fifo")                                  # must not block the class
    (subs / "empty").mkdir()
    _nb(subs / "nolab" / "b01" / "readme.txt", "no notebook")
    os.symlink(subs / "good", subs / "linked")
    found, reasons = _reasons(subs, tmp_path)
    assert [(s.student, s.lab) for s in found] == [("good", "b01")]
    assert "not a readable zip" in reasons["broken"]
    assert "not a valid student id" in reasons["bad id!"] and "not a valid student id" in reasons["=cmd|calc"]
    assert "neither a folder nor a .zip" in reasons["notes.txt"] and "neither" in reasons["fifo"]
    assert "no lab folder" in reasons["empty"]
    assert "holds no notebook" in reasons["nolab"]
    assert "symbolic link" in reasons["linked"]


@pytest.mark.parametrize("name", ["victim\n", "victim\r", "victim\n.zip", "\nvictim", "victim\t"])
def test_a_student_id_matches_whole(tmp_path, name):
    """`$` also matches before a trailing newline: `victim\\n` would land in the gradebook looking
    like the student `victim`. The id must match whole; the real `victim` is still graded."""
    subs = tmp_path / "subs"
    _nb(subs / "victim" / "b01" / "b01_attention.ipynb")
    if name.endswith(".zip"):
        _zip(subs / name, {"b01/b01_attention.ipynb": NB})
    else:
        _nb(subs / name / "b01" / "b01_attention.ipynb")
    found, rejected = collect(subs, tmp_path / "scratch")
    assert [(s.student, s.lab) for s in found] == [("victim", "b01")]
    assert len(rejected) == 1 and not rejected[0].valid_id and "not a valid student id" in rejected[0].reason
    assert "\n" not in rejected[0].student and "\r" not in rejected[0].student


@pytest.mark.parametrize("name, expected", [
    ("../../escaped.txt", "points outside"),
    ("/tmp/escaped_abs.txt", "absolute path"),
    ("C:/Windows/escaped.txt", "absolute path"),
    ("b01\\..\\..\\escaped.txt", "backslashes"),
    ("b01/" + "x" * 300 + ".ipynb", "cap `name_bytes`"),
    ("b01/\x1b[31mred\u202egnp.ipynb", "control or invisible"),
    ("b01/a//b.ipynb", "empty"),
    ("d/" * 3000 + "deep.ipynb", "nested deeper than 12"),
])
def test_absurd_zip_names_are_rejected(tmp_path, name, expected):
    subs = tmp_path / "subs"
    _zip(subs / "mallory.zip", {name: NB, "b01/b01_attention.ipynb": NB})
    found, reasons = _reasons(subs, tmp_path)
    assert found == [] and expected in reasons["mallory"], reasons
    assert not list(tmp_path.parent.glob("escaped*")) and not list((tmp_path / "scratch").rglob("*escaped*"))
    assert "\x1b" not in reasons["mallory"] and "\u202e" not in reasons["mallory"], "the reason must be inert"


def test_zip_names_in_any_encoding(tmp_path):
    """Invalid UTF-8 under the UTF-8 flag; names that collide once normalised or case folded."""
    subs = tmp_path / "subs"
    path = _zip(subs / "bytes.zip", {"b01/abc.ipynb": NB})
    path.write_bytes(path.read_bytes().replace(b"abc.ipynb", b"a\xff\xfe.ipynb"))
    _patch(path, 6, 8, 0x800)                                                 # "this name is UTF-8"
    _zip(subs / "nfc.zip", {"b01/caf\u00e9.ipynb": NB, "b01/cafe\u0301.ipynb": NB})
    _zip(subs / "case.zip", {"b01/Lab.ipynb": NB, "b01/lab.ipynb": NB})
    _zip(subs / "twice.zip", {"b01/lab.ipynb": NB, "b01/lab.ipynb ": NB})
    found, reasons = _reasons(subs, tmp_path)
    assert "not valid UTF-8" in reasons["bytes"]
    assert "same file" in reasons["nfc"] and "same file" in reasons["case"]
    assert [s.student for s in found] == ["twice"]   # a trailing space makes another name: no collision


def test_zip_structure_attacks(tmp_path):
    subs = tmp_path / "subs"
    _zip(subs / "clash.zip", {"b01/x": "file", "b01/x/y.ipynb": NB})
    _zip(subs / "clash2.zip", {"b01/x/y.ipynb": NB, "b01/x": "file"})
    _patch(_zip(subs / "locked.zip", {"b01/b01.ipynb": NB}), 6, 8, 0x1)      # encrypted
    _patch(_zip(subs / "method.zip", {"b01/b01.ipynb": NB}), 8, 10, 99)      # AES, unsupported here
    crc = subs / "crc.zip"
    with zipfile.ZipFile(crc, "w", zipfile.ZIP_STORED) as z:
        z.writestr("b01/b01.ipynb", NB)
    crc.write_bytes(crc.read_bytes().replace(b"x = 1", b"x = 2"))
    _zip(subs / "bomb.zip", {"b01/b01.ipynb": NB, "b01/zeros.bin": b"\0" * (8 * 2**20)})
    _zip(subs / "link.zip", {"b01/ln": "/etc/passwd"}, external_attr=(stat.S_IFLNK | 0o777) << 16)
    _zip(subs / "fifo.zip", {"b01/f": ""}, external_attr=(stat.S_IFIFO | 0o644) << 16)
    _zip(subs / "many.zip", {f"b01/{i}.txt": "x" for i in range(600)})
    found, reasons = _reasons(subs, tmp_path)
    assert found == []
    expected = {"clash": "both as a file and as a folder", "clash2": "both as a file and as a folder",
                "locked": "encrypted", "method": "compression method 99", "crc": "CRC", "bomb": "zip bomb",
                "link": "symbolic link", "fifo": "special file", "many": "cap `files`"}
    for student, words in expected.items():
        assert words in reasons[student], (student, reasons[student])
    assert not any(p.is_symlink() for p in (tmp_path / "scratch").rglob("*"))


def test_caps_on_bytes_are_applied_before_reading(tmp_path):
    """A sparse 64 GiB file and a zip over `total_bytes` are refused from their sizes alone."""
    subs = tmp_path / "subs"
    _nb(subs / "sparse" / "b01" / "b01.ipynb")
    with open(subs / "sparse" / "b01" / "big.bin", "wb") as f:
        f.truncate(64 * 2**30)
    _nb(subs / "fatnb" / "b01" / "b01.ipynb", NB + " " * 5000)
    _zip(subs / "fatzip.zip", {"b01/b01.ipynb": NB, "b01/data.bin": os.urandom(9000)})
    start = time.monotonic()
    found, reasons = _reasons(subs, tmp_path, SMALL)
    assert time.monotonic() - start < 5
    assert "cap `total_bytes`" in reasons["sparse"]
    assert "cap `notebook_bytes`" in reasons["fatnb"]
    assert "cap `total_bytes`" in reasons["fatzip"]


def test_hostile_folders(tmp_path):
    """Links, FIFOs, sockets and devices, names in any encoding, collisions and deep trees."""
    subs = tmp_path / "subs"
    for student in ("link", "fifo", "sock", "dev", "bytes", "ctrl", "long", "case", "deep", "many"):
        _nb(subs / student / "b01" / "b01.ipynb")
    os.symlink("/etc/passwd", subs / "link" / "b01" / "passwd")
    os.mkfifo(subs / "fifo" / "b01" / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(subs / "sock" / "b01" / "s"))
    try:
        os.mknod(subs / "dev" / "b01" / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        os.mkfifo(subs / "dev" / "b01" / "null")
    os.mkdir(os.fsencode(subs / "bytes" / "b01") + b"/\xff\xfe")
    _nb(subs / "ctrl" / "b01" / "x\x1b]0;pwned\x07.txt", "x")
    _nb(subs / "long" / "b01" / ("n" * 200), "x")
    _nb(subs / "case" / "b01" / "B01.ipynb")
    _nb(subs / "deep" / "b01" / ("d/" * 200 + "x.txt"), "x")
    for i in range(600):
        _nb(subs / "many" / "b01" / f"{i}.txt", "x")
    found, reasons = _reasons(subs, tmp_path)
    sock.close()
    assert found == []
    expected = {"link": "symbolic link", "fifo": "FIFO", "sock": "FIFO, device or socket", "dev": "FIFO, device",
                "bytes": "not valid UTF-8", "ctrl": "control or invisible", "long": "cap `name_bytes`",
                "case": "same file", "deep": "deeper than 12", "many": "cap `files`"}
    for student, words in expected.items():
        assert words in reasons[student], (student, reasons[student])
    assert "\x1b" not in reasons["ctrl"] and "\\x1b" in reasons["ctrl"]


def _deep_tree(top, levels):
    """`levels` nested folders below `top`, made with directory fds (the path outgrows PATH_MAX)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(levels):
        os.mkdir("d", dir_fd=fd)
        new = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = new
    os.close(os.open("leaf.ipynb", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    os.close(fd)


def test_trees_thousands_of_levels_deep_are_refused_and_removed_without_recursion(tmp_path):
    subs = tmp_path / "subs"
    _nb(subs / "abyss" / "b01" / "b01.ipynb")
    _deep_tree(subs / "abyss" / "b01", 2100)   # the path outgrows PATH_MAX (4096)
    found, reasons = _reasons(subs, tmp_path)
    assert found == [] and "deeper than 12" in reasons["abyss"]
    remove_tree(subs / "abyss")
    assert not (subs / "abyss").exists()


@pytest.mark.parametrize("content, expected", [
    (b"\x89PNG\r\n\x1a\n\0\0\0junk", "not UTF-8"),
    ('{"cells": [], "x": "caf\xe9"}'.encode("latin-1"), "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "deeper than 64"),
    (b'{"cells": [{"source": "' + b"[" * 1_100_000 + b'"}], "nbformat": []}', "cap `cell_bytes`"),  # text, not nesting
    (b'{"cells": "', "never closed"),
    (b'{"cells": [1, 2', "not valid JSON"),
    (b"[]", "no list of cells"),
    (json.dumps({"cells": [{"cell_type": "code", "source": "x" * 2_000_000}]}).encode(), "cap `cell_bytes`"),
    (json.dumps({"cells": [{"cell_type": "code", "source": ["y = 1\n"] * 300_000}]}).encode(), "cap `cell_bytes`"),
])
def test_notebook_content_is_checked_before_parsing(content, expected):
    start = time.monotonic()
    with pytest.raises(SubmissionError) as err:
        check_notebook(content, GradingCaps(), "b01.ipynb")
    assert expected in str(err.value), str(err.value)
    assert time.monotonic() - start < 3, "checking a notebook must stay cheap"


def test_huge_notebook_file_is_read_no_further_than_its_cap(tmp_path):
    subs = tmp_path / "subs"
    _nb(subs / "huge" / "b01" / "b01.ipynb", NB[:-1] + ', "pad": "' + "x" * 30 * 2**20 + '"}')
    found, reasons = _reasons(subs, tmp_path)
    assert "cap `notebook_bytes`" in reasons["huge"]


def test_copies_are_plain_files_only(tmp_path):
    src = tmp_path / "src"
    _nb(src / "b01_attention.ipynb")
    secret = tmp_path / "secret.txt"
    secret.write_text("gradebook")
    os.symlink(secret, src / "link.txt")
    os.mkfifo(src / "pipe")
    _nb(src / "sub" / "data.txt", "x")
    copy_plain_files(src, tmp_path / "dest")
    assert sorted(str(p.relative_to(tmp_path / "dest")) for p in (tmp_path / "dest").rglob("*")) == \
        ["b01_attention.ipynb", "sub", "sub/data.txt"]
    _nb(tmp_path / "more" / "extra.txt", "y")
    copy_plain_files(tmp_path / "more", tmp_path / "dest", replace=False)
    assert (tmp_path / "dest" / "extra.txt").exists() and (tmp_path / "dest" / "b01_attention.ipynb").exists()


def test_caps_come_from_the_course_config(tmp_path):
    assert Catalog.load().caps.json_depth == 64
    toml = tmp_path / "labs.toml"
    for body, message in [("[grading]\nfiles = 0", "positive integer"), ("[grading]\nfile = 3", "unknown key"),
                          ("[grading]\nfiles = 'many'", "positive integer"),
                          ("[grading]\ncell_bytes = 10\nnotebook_bytes = 5", "cell_bytes <= notebook_bytes")]:
        toml.write_text(textwrap.dedent(body))
        with pytest.raises(CatalogError, match=message):
            Catalog.load(toml)
    toml.write_text("[grading]\nfiles = 7\n")
    assert Catalog.load(toml).caps == GradingCaps(files=7)


def test_a_zip_of_a_million_entries_is_refused_from_its_directory_record(tmp_path):
    """zipfile would build an object per entry before any count could be checked."""
    subs = tmp_path / "subs"
    subs.mkdir()
    entry = b"PK\x01\x02" + bytes(24) + (1).to_bytes(2, "little") + bytes(16) + b"x"   # 47-byte central entries
    n = 1_000_000
    directory = entry * n
    end = b"PK\x05\x06" + bytes(4) + (0xFFFF).to_bytes(2, "little") * 2 + len(directory).to_bytes(4, "little") + \
        bytes(4) + bytes(2)
    (subs / "million.zip").write_bytes(directory + end)
    start = time.monotonic()
    found, reasons = _reasons(subs, tmp_path)
    assert time.monotonic() - start < 2 and "cap `files`" in reasons["million"], reasons
