"""Malformed uploads in one class: an honest reference submission next to one upload per class
of malformation, graded by ONE `camp grade` call.

None of these uploads reaches student code (each is refused while it is read), so the class is
graded with `--isolation none`; the honest student's notebook is the reference solution. Her
score must be full, every malformed upload a 0 with its reason in grades.csv and in that
student's feedback, and every byte of the uploads inert in the terminal, the CSV and the HTML.
"""
import contextlib
import csv
import io
import json
import os
import re
import stat
import zipfile

import pytest

from autograder.cli import main
from autograder.course.reference import student_notebook, write_submission
from autograder.grading import grade as grade_module
from autograder.grading import results as grading_results
from autograder.grading.uploads import remove_tree
from tests.autograder.grading.test_uploads import (
    _patch,  # set a zip header field in place
)

LAB, LAB_NAME = "b01", "b01_attention"
NB_PATH = f"{LAB_NAME}/{LAB_NAME}.ipynb"
INERT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _zip(path, entries, method=zipfile.ZIP_DEFLATED):
    with zipfile.ZipFile(path, "w", method) as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return path


def _folder(subs, student, files):
    for rel, data in files.items():
        path = subs / student / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return subs / student


def _deep(top, levels):
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(levels):
        os.mkdir("d", dir_fd=fd)
        fd, old = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
        os.close(old)
    os.close(fd)


def build_class(subs):
    """Write the class; return {student: words expected in their reason}."""
    good = json.dumps(json.loads((write_submission(subs, "ada", LAB, student_notebook(LAB))).read_text()))
    expected = {}

    def zipped(student, words, entries, **patch):
        path = _zip(subs / f"{student}.zip", entries)
        for (local, central), value in patch.values():
            _patch(path, local, central, value)
        expected[student] = words

    zipped("badzip", "not a readable zip", {NB_PATH: good})
    (subs / "badzip.zip").write_bytes(b"PK\x03\x04" + os.urandom(300))
    crc = _zip(subs / "crc.zip", {NB_PATH: good}, zipfile.ZIP_STORED)
    crc.write_bytes(crc.read_bytes().replace(b'"nbformat": 4', b'"nbformat": 5'))
    expected["crc"] = "CRC"
    zipped("locked", "encrypted", {NB_PATH: good}, flag=((6, 8), 0x1))
    zipped("method", "compression method 99", {NB_PATH: good}, method=((8, 10), 99))
    zipped("longname", "cap `name_bytes`", {NB_PATH: good, f"{LAB_NAME}/{'x' * 400}.py": "x"})
    zipped("ctrlname", "control or invisible", {NB_PATH: good, f"{LAB_NAME}/\x1b[2J\u202eevil.py": "x"})
    zipped("badutf8", "not valid UTF-8", {NB_PATH: good, f"{LAB_NAME}/abc.py": "x"}, utf8=((6, 8), 0x800))
    raw = (subs / "badutf8.zip").read_bytes().replace(b"abc.py", b"a\xff\xfe.py")
    (subs / "badutf8.zip").write_bytes(raw)
    zipped("collide", "same file", {NB_PATH: good, f"{LAB_NAME}/{LAB_NAME.upper()}.ipynb": good})
    zipped("slip", "points outside", {NB_PATH: good, "../../../escaped.txt": "owned"})
    zipped("absolute", "absolute path", {NB_PATH: good, "/tmp/camp_escaped.txt": "owned"})
    zipped("drive", "absolute path", {NB_PATH: good, "C:/camp_escaped.txt": "owned"})
    zipped("backslash", "backslashes", {NB_PATH: good, f"{LAB_NAME}\\..\\..\\escaped.txt": "owned"})
    zipped("clash", "both as a file and as a folder", {NB_PATH: good, f"{LAB_NAME}/data": "x", f"{LAB_NAME}/data/y": "y"})
    zipped("deepzip", "deeper than", {NB_PATH: good, "d/" * 4000 + "x.txt": "x"})
    zipped("zipbomb", "zip bomb", {NB_PATH: good, f"{LAB_NAME}/zeros.bin": b"\0" * (16 * 2**20)})
    zipped("ziplink", "symbolic link", {NB_PATH: good})
    with zipfile.ZipFile(subs / "ziplink.zip", "a") as z:
        info = zipfile.ZipInfo(f"{LAB_NAME}/solutions")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        z.writestr(info, "/work")

    def folder(student, words, files):
        _folder(subs, student, files)
        (subs / student / LAB_NAME).mkdir(parents=True, exist_ok=True)
        expected[student] = words
        return subs / student / LAB_NAME

    with open(folder("sparse", "cap `notebook_bytes`", {}) / f"{LAB_NAME}.ipynb", "wb") as f:
        f.truncate(50 * 2**30)                                                  # 50 GiB of holes
    folder("hugenb", "cap `notebook_bytes`", {NB_PATH: good[:-1] + ', "pad": "' + "x" * (21 * 2**20) + '"}'})
    nb = json.loads(good)
    nb["cells"][-1]["source"] = "# " + "y" * (2 * 2**20)
    folder("hugecell", "cap `cell_bytes`", {NB_PATH: json.dumps(nb)})
    folder("binary", "not UTF-8", {NB_PATH: b"\x7fELF\x02\x01\x01\0" + os.urandom(4000)})
    folder("latin1", "not UTF-8", {NB_PATH: good.replace("Attention", "Att\u00e9ntion").encode("latin-1", "replace")})
    folder("jsonbomb", "deeper than 64", {NB_PATH: "[" * 500_000 + "]" * 500_000})
    folder("truncated", "not a valid notebook", {NB_PATH: good[:len(good) // 2]})
    os.symlink("/etc/passwd", folder("symlink", "symbolic link", {NB_PATH: good}) / "passwd")
    os.mkfifo(folder("fifo", "FIFO", {NB_PATH: good}) / "pipe")
    dev = folder("device", "FIFO, device or socket", {NB_PATH: good}) / "null"
    try:
        os.mknod(dev, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        os.mkfifo(dev)
    _deep(folder("deepdir", "deeper than", {NB_PATH: good}), 2100)   # past PATH_MAX
    os.mkdir(os.fsencode(folder("undecodable", "not valid UTF-8", {NB_PATH: good})) + b"/\xc3\x28")
    folder("toomany", "cap `files`", {NB_PATH: good, **{f"{LAB_NAME}/f{i}.txt": "x" for i in range(600)}})
    folder("emptylab", "holds no notebook", {f"{LAB_NAME}/README": "nothing here"})
    (subs / "empty").mkdir()
    expected["empty"] = "no lab folder"
    (subs / "plainfile").write_text("not a folder")
    expected["plainfile"] = "neither a folder nor a .zip"
    os.mkfifo(subs / "pipe")
    expected["pipe"] = "neither a folder nor a .zip"
    (subs / "=HYPERLINK(\"http:evil\")").mkdir()                       # formula as a student id
    (subs / "\x1b]0;owned\x07\u202eid").mkdir()                          # terminal escape, bidi override
    return expected


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uploads")
    subs = tmp / "submissions"
    expected = build_class(subs)
    out = tmp / "ws"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["grade", str(subs), "--out", str(out), "--isolation", "none"])
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    yield code, out, rows, expected, buf.getvalue()
    remove_tree(subs)   # folders thousands of levels deep: pytest's own clean-up would recurse


@pytest.mark.slow
def test_honest_student_scores_full_and_every_malformed_upload_is_a_zero_with_its_reason(graded):
    code, out, rows, expected, _ = graded
    assert code == 0, "students' failures are not grader errors"
    by_student = {r["student"]: r for r in rows if r["lab"] == LAB}
    assert by_student["ada"]["status"] == "graded" and float(by_student["ada"]["score"]) == 12
    missing = sorted(set(expected) - set(by_student))
    assert not missing, f"no b01 row for {missing}"
    for student, words in expected.items():
        row = by_student[student]
        assert row["status"] == "error" and float(row["score"]) == 0, (student, row)
        assert float(row["max_score"]) == 12, (student, row)
        assert words in row["message"], (student, words, row["message"])
    assert len(rows) == len(expected) + 1 + 2, "one row per student, and one per invalid id"
    assert not list(out.rglob("*escaped*")) and not list(out.parent.parent.glob("*escaped*"))
    assert not os.path.exists("/tmp/camp_escaped.txt")


@pytest.mark.slow
def test_reasons_reach_each_students_feedback(graded):
    _, out, rows, expected, _ = graded
    for row in rows:
        if row["student"] in expected:
            page = (out / row["feedback"]).read_text(encoding="utf-8")
            assert "0 / 12 points" in page and expected[row["student"]] in page.replace("&#x27;", "'").replace(
                "&quot;", '"'), row["student"]


@pytest.mark.slow
def test_every_output_is_inert(graded):
    _, out, rows, _, printed = graded
    assert not INERT.search(printed), "control/bidi characters reached the terminal"
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        cells = [c for row in csv.reader(f) for c in row]
    assert not any(INERT.search(c) for c in cells)
    assert not [c for c in cells if c[:1] in ("=", "+", "-", "@")], "a cell a spreadsheet would run as a formula"
    assert any(c.startswith("'=HYPERLINK") for c in cells)
    report = (out / "report.html").read_text(encoding="utf-8")
    assert not INERT.search(report) and "<script" not in report.lower()
    assert not re.search(r"""(src|href)\s*=\s*['"]?\s*(https?:)?//""", report)


def _small_class(tmp_path):
    subs = tmp_path / "subs"
    write_submission(subs, "ada", LAB, student_notebook(LAB))
    write_submission(subs, "bea", LAB, student_notebook(LAB))
    (subs / "carl.zip").write_bytes(b"junk")
    return subs


class FakePool:
    """Stands in for autograder.grading.pool.GradingPool: no workers, results made up by `run`."""

    def __init__(self, n, isolation, threads, warm):
        pass

    def close(self):
        pass


def _sheet(out):
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        return {r["student"]: r for r in csv.DictReader(f)}


@pytest.mark.slow
def test_a_crash_midway_still_writes_the_grade_sheet_and_exits_non_zero(tmp_path, monkeypatch, capsys):
    class BrokenPool(FakePool):
        def run(self, jobs):
            raise RuntimeError("the worker pool broke")
            yield

    monkeypatch.setattr(grade_module, "GradingPool", BrokenPool)
    out = tmp_path / "ws"
    assert main(["grade", str(_small_class(tmp_path)), "--out", str(out), "--isolation", "none"]) == 1
    sheet = _sheet(out)
    for student in ("ada", "bea"):
        assert sheet[student]["status"] == "grader error" and "the worker pool broke" in sheet[student]["message"]
    assert sheet["carl"]["status"] == "error" and "not a readable zip" in sheet["carl"]["message"]
    assert (out / "report.html").is_file()
    assert "grading stopped" in capsys.readouterr().err


@pytest.mark.slow
def test_grader_errors_exit_non_zero_and_are_named_while_the_rest_is_graded(tmp_path, monkeypatch, capsys):
    class BeaOnlyPool(FakePool):
        def run(self, jobs):
            for job in jobs:
                tests = [grading_results.TestOutcome("test_softmax", 12.0, 12.0 if job["student"] == "bea" else 0.0)]
                status, retry = ("graded", False) if job["student"] == "bea" else ("error", True)
                yield job, grading_results.SubmissionResult(job["student"], job["lab"], status, score=tests[0].score,
                                                            max_score=12.0, tests=tests, retry=retry,
                                                            message="" if not retry else "grader error: boom"), False

    monkeypatch.setattr(grade_module, "GradingPool", BeaOnlyPool)
    out = tmp_path / "ws"
    assert main(["grade", str(_small_class(tmp_path)), "--out", str(out), "--isolation", "none"]) == 1
    sheet = _sheet(out)
    assert sheet["ada"]["status"] == "grader error" and sheet["bea"]["status"] == "graded"
    assert float(sheet["bea"]["score"]) == 12 and sheet["carl"]["status"] == "error"
    err = capsys.readouterr().err
    assert "grader failed on 1 submission" in err and "ada" in err and "bea" not in err

    real_publish = grade_module._publish

    def publish_fails_for_bea(out_, lab, result, caps):
        if result.student == "bea":
            raise OSError("disk full")
        return real_publish(out_, lab, result, caps)

    monkeypatch.setattr(grade_module, "_publish", publish_fails_for_bea)
    assert main(["grade", str(_small_class(tmp_path)), "--out", str(out), "--isolation", "none"]) == 1
    sheet = _sheet(out)
    assert sheet["bea"]["status"] == "grader error" and "publishing the result failed" in sheet["bea"]["message"]
    assert sheet["carl"]["status"] == "error"
