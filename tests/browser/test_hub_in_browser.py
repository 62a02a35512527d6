"""A class through `make hub` in a real browser: two students and an instructor, real local users.

The instructor releases b01 (nbgrader's CLI, as in a terminal of their JupyterLab). Each student
logs in on the hub's login page with their Unix password (PAM), gets their own JupyterLab, fetches
the lab in the Assignment List into their home, saves their work (JupyterLab's file API) and
submits it with the Submit button. The instructor collects, `camp grade` grades in its sandbox
(as root: `sudo camp grade`), nbgrader releases camp's feedback; each student presses Fetch
Feedback, nbgrader offers "view feedback" (the fetched page is the released one byte for byte) and
the student reads their own page as their JupyterLab serves it (their score, no hidden test
source, every formula typeset by the server's own MathJax), the instructor reads camp grade's page
from disk (typeset by the copy beside it), and the instructor's Formgrader counts both submissions
graded. No page of anyone's loads anything from another host. Bob, who turned in a read-only
file, submits again, and the instructor's next collect replaces the copy `camp grade` (root)
wrote: nbgrader's pitfalls on a shared exchange, with everyone under `umask 077`. A student then tries to read what is not theirs from
a terminal (a classmate's home and feedback, the exchange's inbound and feedback folders, the
source notebooks with the hidden tests, the gradebook, the repository's history) and through the
file API of a classmate's and the instructor's servers: all refused, while their own copy, the
released labs and the course's packages stay readable (so the refusals are not a broken probe).

The users, groups, the hub and its folders are throwaway (tests/browser/hub_class.py), removed
even on failure. Needs root (useradd, PAM, a process per user) and Chromium: otherwise a loud
skip, and a failure under CI.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from autograder.catalog import Catalog, repo_root
from autograder.course import hub
from autograder.course.reference import student_notebook

from autograder.reports.mathjax import FETCHED_DIR

from .conftest import _not_run, type_in_a_new_terminal, typeset_formulas
from .hub_class import HubClass

ROOT = repo_root()
LAB, LAB_NAME = "b01", "b01_attention"
COURSE = "llm-camp"


def _hidden_test_lines() -> list[str]:
    """Lines of b01's hidden tests that the released notebook does not hold (they must never
    reach a student)."""
    nb = nbformat.read(Catalog.load().get(LAB).source_path(ROOT), as_version=4)
    released = Catalog.load().get(LAB).release_path(ROOT).read_text()
    lines = []
    for cell in nb.cells:
        m = re.search(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", cell.source, re.S)
        if m:
            lines += [ln.strip() for ln in m.group(1).splitlines() if len(ln.strip()) > 25
                      and json.dumps(ln.strip())[1:-1] not in released]
    assert lines, "b01's source has no hidden tests to look for"
    return lines


def _bobs_notebook():
    """Bob's work: everything solved but the first exercise, left as released."""
    released = nbformat.read(Catalog.load().get(LAB).release_path(ROOT), as_version=4)
    first = next(c for c in released.cells if c.metadata.get("nbgrader", {}).get("solution"))
    return student_notebook(LAB, answers={first.metadata["nbgrader"]["grade_id"]: first.source})


@pytest.fixture
def hub_class(chromium_path, tmp_path):
    if os.geteuid() != 0:
        _not_run("the hub test needs root (it creates local users; JupyterHub runs a process per user)")
    for tool in ("useradd", "userdel", "groupadd", "chpasswd", "runuser"):
        if not shutil.which(tool):
            _not_run(f"{tool} is missing (package passwd / util-linux)")
    try:
        hub.install_proxy()
    except (SystemExit, subprocess.CalledProcessError) as exc:
        _not_run(f"JupyterHub's proxy could not be installed: {exc}")
    with HubClass(ROOT, tmp_path / "hub.log") as hc:
        yield hc


@pytest.mark.slow
def test_two_students_and_an_instructor_through_the_hub(hub_class, chromium_path, tmp_path):
    from playwright.sync_api import sync_playwright

    hc, started, times, rss, requests = hub_class, time.monotonic(), {}, {}, []
    ada, bob = hc.students
    teacher = hc.instructor
    lap = lambda name: times.__setitem__(name, round(time.monotonic() - started, 1))   # noqa: E731
    release = hc.start_as_user(teacher, "nbgrader", "release_assignment", LAB_NAME)   # while the servers start
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path, headless=True)
        try:
            pages = {user: _log_in(browser, hc, user, requests) for user in (ada, bob, teacher)}   # servers start together
            _finished(release, "release")
            lap("released")
            for user, page in pages.items():
                _wait_for_lab(page, hc, user, tmp_path)
            lap("three JupyterLabs up")
            rss = {user: hc.memory_mib(user) for user in pages}   # README "How many users"
            for student in (ada, bob):
                _assignment_list(pages[student])
                _press(pages[student], "#released_assignments_list", "Fetch", "#fetched_assignments_list")
                copy = hc.home(student) / COURSE / LAB_NAME / f"{LAB_NAME}.ipynb"
                assert copy.is_file() and copy.stat().st_uid == hc.uid(student), f"{student}'s fetched copy: {copy}"
            lap("fetched")
            _save(pages[ada], hc, ada, student_notebook(LAB))
            _save(pages[bob], hc, bob, _bobs_notebook())
            _save_read_only_file(hc, bob)   # nbgrader's pitfall: read-only files break a later collect
            for student in (ada, bob):
                _assignment_list(pages[student])
                _press(pages[student], "#fetched_assignments_list", "Submit", "#submitted_assignments_list")
            lap("submitted")

            _finished(hc.as_user(teacher, "nbgrader", "collect", LAB_NAME), "collect")
            grade = subprocess.run([str(Path(sys.executable).parent / "camp"), "grade", str(hc.workspace / "collected"),
                                    "--lab", LAB, "--out", str(hc.workspace), "--jobs", "2"], cwd=ROOT, env=hc.env,
                                   capture_output=True, text=True, timeout=300,   # as root: `sudo camp grade`
                                   preexec_fn=lambda: os.umask(0o077))            # sudo keeps an instructor's 077
            assert grade.returncode == 0, grade.stdout + grade.stderr
            assert re.search(rf"{ada}\s+{LAB}\s+12\s+12\s+graded", grade.stdout), grade.stdout
            bob_score = re.search(rf"{bob}\s+{LAB}\s+(\d+(?:\.\d+)?)\s+12\s+graded", grade.stdout)
            assert bob_score and float(bob_score.group(1)) < 12, grade.stdout
            lap("collected and graded")
            feedback = hc.start_as_user(teacher, "nbgrader", "release_feedback", LAB_NAME)
            for user in (bob, teacher):   # meanwhile: another user's server, through the file API
                status = pages[ada].evaluate("async (u) => (await fetch(u)).status", f"{hc.base}/user/{user}/api/contents")
                assert status in (403, 404), f"{ada} read {user}'s files through the file API (HTTP {status})"
            _finished(feedback, "release_feedback")
            released = {p.read_bytes() for p in (hc.exchange / COURSE / "feedback").glob("*.html")}
            assert len(released) == 2, f"released feedback pages: {len(released)}"
            lap("feedback released")
            probe = _probe_from_a_terminal(pages[ada], hc, ada, bob)
            lap("probes")

            fetched = {student: _fetch_feedback(pages[student], hc, student, released) for student in (bob, ada)}
            lap("feedback fetched")
            # bob turns in again; the instructor's next collect replaces what `sudo camp grade` wrote
            before = (hc.workspace / "collected" / bob / LAB_NAME / "timestamp.txt").read_text()
            _assignment_list(pages[bob])
            row = pages[bob].locator("#fetched_assignments_list .list_item", has_text=LAB_NAME).first
            row.locator("button", has_text=re.compile(r"^Submit$")).click()
            inbound = hc.exchange / COURSE / "inbound"
            deadline = time.monotonic() + 60
            while len(list(inbound.glob(f"{bob}+{LAB_NAME}+*"))) < 2 and time.monotonic() < deadline:
                time.sleep(0.3)
            assert len(list(inbound.glob(f"{bob}+{LAB_NAME}+*"))) == 2, "bob's second Submit did not reach the exchange"
            second = hc.start_as_user(teacher, "nbgrader", "collect", "--update", LAB_NAME)

            # meanwhile, each student reads their fetched page as their JupyterLab serves it, and the
            # instructor reads camp grade's page from disk: formulas typeset by a local MathJax
            hidden = _hidden_test_lines()
            for student, score in ((ada, "12"), (bob, bob_score.group(1))):
                text = _read_feedback(pages[student].context.new_page(), f"{hc.base}/user/{student}/files/"
                                      + fetched[student].relative_to(hc.home(student)).as_posix())
                assert re.search(rf"\b{re.escape(_plain(score))}\s*/\s*12\b", text), f"{student}'s feedback:\n{text[:1500]}"
                leaked = [ln for ln in hidden if ln in text]
                assert not leaked, f"hidden tests in {student}'s feedback: {leaked[:3]}"
                assert ("not written yet" in text) == (student == bob), f"{student}'s feedback:\n{text[:1500]}"
            graders = browser.new_context()
            graders.on("request", lambda r: requests.append(r.url))
            text = _read_feedback(graders.new_page(), (hc.workspace / "feedback" / ada / LAB_NAME / f"{LAB_NAME}.html").as_uri())
            assert re.search(r"\b12\s*/\s*12\b", text), text[:1500]
            lap("feedback read")
            assert _formgrader_counts(pages[teacher], hc, teacher) == ("released", "2")
            lap("formgrader")

            _finished(second, "a second collect")
            after = (hc.workspace / "collected" / bob / LAB_NAME / "timestamp.txt").read_text()
            assert after > before, f"the second collect kept bob's first submission ({before} -> {after})"
            lap("second collect")
        finally:
            browser.close()
            print("hub round trip, seconds since start: " + ", ".join(f"{k} {v}" for k, v in times.items()))
            if rss:
                print("memory of each idle JupyterLab (MiB, all the user's processes): " + str(rss))
    elsewhere = sorted({u for u in requests if not u.startswith((hc.base, "file://", "data:", "blob:", "about:"))})
    assert not elsewhere, f"pages loaded from other hosts (a CDN?): {elsewhere[:10]}"
    refused = {"DENIED"}
    wrong = [line for line in probe if line.split(" ", 1)[0] not in refused and not line.startswith("READ (own)")]
    assert not wrong, "a student read what is not theirs, or a probe named nothing:\n" + "\n".join(probe)


def _finished(run, what: str) -> None:
    out, err = run.communicate(timeout=300) if isinstance(run, subprocess.Popen) else (run.stdout, run.stderr)
    assert run.returncode == 0, f"{what} failed:\n{out}\n{err}"


def _save_read_only_file(hc, user) -> None:
    """A data file the student made read-only, beside their notebook."""
    path = hc.home(user) / COURSE / LAB_NAME / "notes.txt"
    path.write_text("my notes\n")
    os.chown(path, hc.uid(user), -1)
    os.chmod(path, 0o444)


def _plain(score: str) -> str:
    return score[:-2] if score.endswith(".0") else score


def _log_in(browser, hc, user, requests: list[str]):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.on("request", lambda r: requests.append(r.url))   # every page of this user's, every tab
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(f"{hc.base}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", hc.password)
    page.click("#login_submit", no_wait_after=True)
    return page


def _wait_for_lab(page, hc, user, tmp_path) -> None:
    try:
        page.wait_for_url(f"**/user/{user}/lab**", timeout=180_000)
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Nbgrader$")).wait_for(timeout=120_000)
    except Exception:
        page.screenshot(path=str(tmp_path / f"{user}.png"))
        raise AssertionError(f"{user}'s JupyterLab did not open ({page.url}); hub log:\n{hc.output()[-3000:]}") from None


def _assignment_list(page) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Nbgrader$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Assignment List$")).click()
    page.locator("#released_assignments_list").wait_for()


def _press(page, section: str, button: str, lands_in: str) -> None:
    """Press `button` on the lab's row in `section` of the Assignment List; the row then shows
    in `lands_in`."""
    row = page.locator(f"{section} .list_item", has_text=LAB_NAME).first
    row.locator("button", has_text=re.compile(rf"^{button}$")).click()
    page.locator(f"{lands_in} .list_item", has_text=LAB_NAME).first.wait_for(timeout=60_000)


def _xsrf_fetch(page, url: str, method: str, body: str | None = None) -> int:
    return page.evaluate(
        """async ([url, method, body]) => {
             const m = document.cookie.match(/_xsrf=([^;]+)/);
             const r = await fetch(url, {method, body, headers: {"Content-Type": "application/json",
                                           "X-XSRFToken": m ? decodeURIComponent(m[1]) : ""}});
             return r.status; }""", [url, method, body])


def _save(page, hc, user, nb) -> None:
    """The student's work saved into their copy through JupyterLab's file API (what Save does)."""
    path = f"{COURSE}/{LAB_NAME}/{LAB_NAME}.ipynb"
    body = json.dumps({"type": "notebook", "format": "json", "content": json.loads(nbformat.writes(nb))})
    status = _xsrf_fetch(page, f"{hc.base}/user/{user}/api/contents/{path}", "PUT", body)
    assert status in (200, 201), f"saving {user}'s notebook: HTTP {status}"


def _fetch_feedback(page, hc, user, released: set[bytes]) -> Path:
    """Fetch Feedback in the Assignment List; "view feedback" shows only when the fetched page is
    the released one byte for byte (nbgrader compares checksums), and the course's fetch step put
    MathJax beside it. The fetched page's path."""
    _assignment_list(page)
    row = page.locator("#submitted_assignments_list .list_item", has_text=LAB_NAME).first
    row.locator("button", has_text=re.compile(r"^Fetch Feedback$")).click()
    page.locator("#submitted_assignments_list a", has_text="view feedback").first.wait_for(timeout=60_000)
    feedback = hc.home(user) / COURSE / LAB_NAME / "feedback"
    pages = sorted(feedback.glob(f"*/{LAB_NAME}.html"))
    assert len(pages) == 1, f"{user}'s fetched feedback: {pages}"
    assert pages[0].read_bytes() in released, f"{user}'s fetched page differs from the released one"
    assert (feedback / FETCHED_DIR / "MathJax.js").is_file(), f"no MathJax beside {user}'s fetched feedback"
    return pages[0]


def _read_feedback(viewer, url: str) -> str:
    """The text of a feedback page at `url` (a student's JupyterLab serving it as "Open in New
    Browser Tab" does, or a file), once MathJax typeset every formula; the page is closed."""
    try:
        viewer.goto(url)
        seen = typeset_formulas(viewer)
        assert seen["formulas"] > 5 and seen["typeset"] == seen["formulas"] and not seen["raw"], (url, seen)
        return viewer.locator("body").inner_text()
    finally:
        viewer.close()


def _formgrader_counts(page, hc, user) -> tuple[str, str]:
    page.goto(f"{hc.base}/user/{user}/formgrader/manage_assignments")
    page.locator("#main-table a", has_text=LAB_NAME).first.wait_for()
    row = page.locator("#main-table tr", has=page.locator("a", has_text=LAB_NAME)).first
    return row.locator(".status").inner_text().strip(), row.locator(".num-submissions").inner_text().strip()


def _probe_from_a_terminal(page, hc, user, classmate) -> list[str]:
    """What `user` can read from a JupyterLab terminal: one line per path, READ, DENIED
    (permission denied) or MISSING (no such file: a probe that proves nothing, which fails)."""
    mate = hc.home(classmate) / COURSE / LAB_NAME
    inbound, feedback = hc.exchange / COURSE / "inbound", hc.exchange / COURSE / "feedback"
    source = Catalog.load().get(LAB).source_path(ROOT)
    files = [mate / f"{LAB_NAME}.ipynb", source, hc.workspace / "gradebook.db",
             hc.workspace / "source" / LAB_NAME / f"{LAB_NAME}.ipynb",
             hc.workspace / "collected" / classmate / LAB_NAME / f"{LAB_NAME}.ipynb", ROOT / "tests" / "conftest.py"]
    folders = [hc.home(classmate), inbound, feedback, source.parent, hc.workspace, hc.workspace / "collected"]
    if (ROOT / ".git").is_dir():
        folders.append(ROOT / ".git")
    missing = [p for p in files + folders if not p.exists()]
    assert not missing, f"the probe would look for what is not there: {missing}"
    verdict = ("2>&1 >/dev/null); case $? in 0) echo READ {tag}'{p}';; *) case \"$e\" in *'No such'*) "
               "echo MISSING {tag}'{p}';; *) echo DENIED {tag}'{p}';; esac;; esac")
    script = ["#!/bin/sh"]
    script += ["e=$(cat '{p}' ".format(p=p) + verdict.format(tag="", p=p) for p in files]
    script += ["e=$(ls '{p}' ".format(p=p) + verdict.format(tag="", p=p) for p in folders]
    own = [hc.home(user) / COURSE / LAB_NAME / f"{LAB_NAME}.ipynb", Catalog.load().get(LAB).release_path(ROOT)]
    script += ["e=$(cat '{p}' ".format(p=p) + verdict.format(tag="'(own)' ", p=p) for p in own]
    script += ["python -c 'import camplib.attention, autograder.checks' && echo 'READ (own) course packages' "
               "|| echo 'DENIED (own) course packages'"]
    body = json.dumps({"type": "file", "format": "text", "content": "\n".join(script) + "\n"})
    assert _xsrf_fetch(page, f"{hc.base}/user/{user}/api/contents/probe.sh", "PUT", body) in (200, 201)
    out = hc.home(user) / "probe.txt"
    type_in_a_new_terminal(page, "sh probe.sh > probe.tmp 2>&1; mv probe.tmp probe.txt; exit")   # in the open JupyterLab
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not out.exists():
        time.sleep(0.3)
    assert out.exists(), f"the terminal never wrote {out}"
    assert out.stat().st_uid == hc.uid(user), "the terminal did not run as the student"
    text = out.read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith(("READ ", "DENIED ", "MISSING "))]
    assert len(lines) == len(files) + len(folders) + len(own) + 1, text
    assert all(ln.startswith("READ (own)") for ln in lines if "(own)" in ln), f"a student's own files:\n{text}"
    return lines
