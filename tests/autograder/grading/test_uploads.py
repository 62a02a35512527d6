"""Reading submissions treats input as hostile: bad ids, zip-slip, links and junk are reported
per student and never escape the scratch folder."""
import os
import stat
import zipfile

from autograder.grading.uploads import collect, copy_plain_files


def _nb(path, text="{}"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_folders_and_zips(tmp_path):
    subs = tmp_path / "subs"
    _nb(subs / "alice" / "b01_attention" / "b01_attention.ipynb")
    with zipfile.ZipFile(subs / "bob.zip", "w") as z:           # zip of the lab folders
        z.writestr("b01_attention/b01_attention.ipynb", "{}")
    with zipfile.ZipFile(subs / "carol.zip", "w") as z:         # zip of the whole student folder
        z.writestr("carol/b01/b01_attention.ipynb", "{}")
    found, rejected = collect(subs, tmp_path / "scratch")
    assert rejected == []
    assert [(s.student, s.lab) for s in found] == [("alice", "b01_attention"), ("bob", "b01_attention"), ("carol", "b01")]
    assert all((s.path / "b01_attention.ipynb").is_file() for s in found)


def test_hostile_entries_are_rejected_per_student(tmp_path):
    subs = tmp_path / "subs"
    _nb(subs / "good" / "b01" / "b01_attention.ipynb")
    with zipfile.ZipFile(subs / "slip.zip", "w") as z:
        z.writestr("../../escaped.txt", "owned")
    with zipfile.ZipFile(subs / "abs.zip", "w") as z:
        z.writestr("/tmp/escaped_abs.txt", "owned")
    (subs / "broken.zip").write_bytes(b"not a zip")
    (subs / "bad id!").mkdir()
    (subs / "notes.txt").write_text("hello")
    (subs / "empty").mkdir()
    os.symlink(subs / "good", subs / "linked")
    found, rejected = collect(subs, tmp_path / "scratch")
    assert [(s.student, s.lab) for s in found] == [("good", "b01")]
    reasons = {r.student: r.reason for r in rejected}
    assert "points outside" in reasons["slip"] and "points outside" in reasons["abs"]
    assert "not a readable zip" in reasons["broken"]
    assert "not a valid student id" in reasons["bad id!"]
    assert "neither a folder nor a .zip" in reasons["notes.txt"]
    assert "no lab folder" in reasons["empty"]
    assert "symbolic link" in reasons["linked"]
    assert not (tmp_path / "escaped.txt").exists() and not any(tmp_path.parent.glob("escaped*"))


def test_links_inside_submissions_are_not_copied(tmp_path):
    src = tmp_path / "src"
    _nb(src / "b01_attention.ipynb")
    secret = tmp_path / "secret.txt"
    secret.write_text("gradebook")
    os.symlink(secret, src / "link.txt")
    with zipfile.ZipFile(tmp_path / "s.zip", "w") as z:
        info = zipfile.ZipInfo("lab/ln")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        z.writestr(info, str(secret))
    copy_plain_files(src, tmp_path / "dest")
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == ["b01_attention.ipynb"]
    subs = tmp_path / "subs"
    subs.mkdir()
    os.replace(tmp_path / "s.zip", subs / "s.zip")
    found, _ = collect(subs, tmp_path / "scratch")
    assert not any(p.is_symlink() or p.name == "ln" for p in (tmp_path / "scratch").rglob("*"))
