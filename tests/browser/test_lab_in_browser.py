"""`make lab` in a real browser, as a student and as an instructor would use it.

One test, in the order people go, with a student's `make lab` and an instructor's `make lab
ROLE=instructor` running side by side: the ladder is printed and JupyterLab opens, with no
Jupyter news prompt; the student's Nbgrader menu has no instructor tools (and the server no
Formgrader); the instructor's has one Formgrader entry, which lists the lab as released (on a
fresh workspace: it creates the gradebook, which needs `alembic` on the server's PATH); a solved
b01 runs top to bottom (menu Run > Run All Cells) and its attention widget renders; nbgrader's
Validate button says it passes; `camp`, `nbgrader` and `alembic` are the venv's in a JupyterLab
terminal; meanwhile `camp grade` grades the same reference submission into the grading
workspace the server's nbgrader_config.py reads, and Formgrader then counts one submission,
shows it graded with its score, time and a name (not "None"), not flagged for manual grading,
and opens it for manual grading with MathJax served by the server. No page loads anything from
another host, and nbgrader logs its exchange listing once, not once per page.

The workspace and the exchange are temporary ($CAMP_GRADING_DIR / $CAMP_EXCHANGE_DIR, the one
setting both `camp grade` and nbgrader_config.py read), so a real grading/ is never touched; the
notebook lives in runs/ (the server's root is the repository, as in `make lab`).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from autograder.catalog import repo_root
from autograder.course.reference import student_notebook, write_submission

from .conftest import type_in_a_new_terminal
from .lab_server import LabServer

ROOT = repo_root()
LAB, LAB_NAME, STUDENT = "b01", "b01_attention", "ada"
TOTAL_BUDGET_S = 300   # fail rather than hang (each browser step also has its own timeout)
# JupyterLab settings for the test's own (temporary) settings folder: every cell in the DOM, so the
# test can read every prompt (the default attaches only what is on screen). No news setting here:
# the course's own (course/jupyter) must keep the prompt away.
LAB_SETTINGS = {"@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"}}
INSTRUCTOR_TOOLS = ("Formgrader", "Course List", "Create assignment")


@pytest.fixture
def sandbox(tmp_path):
    """Temporary workspace, exchange, JupyterLab state; a folder for the notebook under runs/."""
    (ROOT / "runs").mkdir(exist_ok=True)
    notebooks = Path(tempfile.mkdtemp(prefix="browser-", dir=ROOT / "runs"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "CAMP_"))}
    env.update(CAMP_GRADING_DIR=str(tmp_path / "grading"), CAMP_EXCHANGE_DIR=str(tmp_path / "exchange"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "lab-settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "lab-workspaces"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), SHELL="/bin/bash")
    for plugin, settings in LAB_SETTINGS.items():
        path = tmp_path / "lab-settings" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings))
    try:
        yield tmp_path, notebooks, env
    finally:
        shutil.rmtree(notebooks, ignore_errors=True)


@pytest.mark.slow
def test_student_and_instructor_in_a_real_browser(sandbox, browser_page):
    tmp, notebooks, env = sandbox
    page, started, times = browser_page, time.monotonic(), {}
    nb = student_notebook(LAB)
    write_submission(tmp / "submissions", STUDENT, LAB, nb)
    opened = write_submission(notebooks, "me", LAB, nb)   # runs/browser-*/me/b01_attention/...
    isolation = "auto" if os.geteuid() == 0 else "none"   # the reference solution is trusted code
    camp = [str(Path(sys.executable).parent / "camp"), "grade", str(tmp / "submissions"), "--lab", LAB,
            "--isolation", isolation]
    grading, grading_log = None, open(tmp / "camp-grade.log", "w")
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    try:
        with LabServer(ROOT, env, tmp / "make-lab.log") as lab, \
                LabServer(ROOT, env, tmp / "make-lab-instructor.log", role="instructor") as teacher:
            times["servers up"] = time.monotonic() - started
            assert re.search(rf"^{LAB}\s+basic", lab.output(), re.M), "make lab did not print the ladder"
            _opens_on_the_labs(page, lab)
            _no_news_prompt(page, lab)
            assert _nbgrader_menu(page) == ["Assignment List"], "a student's Nbgrader menu"
            assert not page.locator(".lm-TabBar-tab", has_text="Create Assignment").count()
            assert page.goto(lab.url("/formgrader")).status == 404, "Formgrader is served to students"
            times["student's lab opens on labs/"] = time.monotonic() - started
            _opens_on_the_labs(page, teacher)
            menu = _nbgrader_menu(page)
            assert all(menu.count(tool) == 1 for tool in INSTRUCTOR_TOOLS), f"the instructor's Nbgrader menu: {menu}"
            assert page.locator(".lm-TabBar-tab", has_text="Create Assignment").count() == 1
            # on a fresh workspace, Formgrader creates the gradebook (nbgrader runs alembic)
            assert _formgrader_lists_the_lab(page, teacher) == ("released", "0")
            assert (tmp / "grading" / "gradebook.db").is_file(), "Formgrader did not create the gradebook"
            times["formgrader lists the lab"] = time.monotonic() - started
            grading = subprocess.Popen(camp, cwd=tmp, env=env, stdout=grading_log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)   # grades while the student works
            _run_all_and_see_the_widget(page, lab, opened.relative_to(ROOT), tmp / "run-all.png")
            times["run all + widget"] = time.monotonic() - started
            _validate(page)
            times["validate"] = time.monotonic() - started
            _camp_in_a_terminal(page, tmp / "terminal.txt")
            times["terminal"] = time.monotonic() - started
            grading.wait(timeout=max(10, TOTAL_BUDGET_S - (time.monotonic() - started)))
            times["camp grade done"] = time.monotonic() - started
            grade_log = (tmp / "camp-grade.log").read_text()
            assert grading.returncode == 0 and re.search(rf"{STUDENT}\s+{LAB}\s+12\s+12\s+graded", grade_log), grade_log
            assert _formgrader_lists_the_lab(page, teacher) == ("released", "1")
            _formgrader_shows_the_graded_submission(page, teacher, tmp / "grading")
            times["formgrader shows the submission"] = time.monotonic() - started
            listings = teacher.output().count("Released assignments:")
            assert listings == 1, f"nbgrader listed the exchange in the log {listings} times, not once"
    finally:
        if grading is not None:
            if grading.poll() is None:
                grading.kill()
            grading.wait()
        grading_log.close()
    bases = (lab.base, teacher.base, "data:", "blob:", "about:")
    elsewhere = sorted({u for u in requests if not u.startswith(bases)})
    assert not elsewhere, f"pages loaded from other hosts (a CDN?): {elsewhere[:10]}"
    print("browser smoke test, seconds since start: " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()))


def _opens_on_the_labs(page, lab) -> None:
    """What a student sees first: JupyterLab's file browser in labs/, the ladder's folders."""
    page.goto(lab.url("/"))
    page.locator(".jp-DirListing-item", has_text=LAB_NAME).first.wait_for(timeout=60_000)
    assert "/lab/tree/labs" in page.url, page.url


def _run_all_and_see_the_widget(page, lab, notebook: Path, shot: Path) -> None:
    page.goto(lab.url(f"/lab/tree/{notebook.as_posix()}"))
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
    choose = page.locator(".jp-Dialog", has_text="Select Kernel")   # JupyterLab asks; a person says yes
    try:
        choose.wait_for(timeout=10_000)
        choose.locator("button.jp-mod-accept").click()
    except PlaywrightTimeout:
        pass
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=60_000)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    n_code = page.locator(".jp-Notebook .jp-CodeCell").count()
    prompts = ".jp-Notebook .jp-CodeCell .jp-InputPrompt"
    try:
        page.wait_for_function(
            """([sel, n]) => { const p = [...document.querySelectorAll(sel)].map(e => e.textContent);
                             return p.length === n && p.every(t => /\\[\\d+\\]/.test(t)); }""",
            arg=[prompts, n_code], timeout=150_000, polling=500)
    except Exception:
        page.screenshot(path=str(shot), full_page=True)
        raise AssertionError(f"Run All did not finish all {n_code} code cells; prompts: "
                             f"{page.locator(prompts).all_inner_texts()}; screenshot {shot}") from None
    outputs = page.locator(".jp-Notebook .jp-OutputArea-output").all_inner_texts()
    errors = [o for o in outputs if "Traceback (most recent call last)" in o]
    assert not errors, f"a cell raised while running all {n_code} code cells:\n{errors[0][:2000]}"
    widget = page.locator(".jp-Notebook .widget-interact")
    widget.wait_for(timeout=30_000)
    assert widget.locator(".widget-slider").count() == 2, "the attention widget has no layer/head sliders"
    # The attention map the sliders drive. It never came twice in full runs: the pytest worker had
    # graded before and MPLBACKEND=Agg had leaked into its environment, so the kernel Jupyter
    # started drew no inline figures (fixed in autograder.grading.pool; tested in test_parts).
    widget.scroll_into_view_if_needed()
    try:
        widget.locator("img").first.wait_for(timeout=90_000)
    except PlaywrightTimeout:
        page.screenshot(path=str(shot), full_page=True)
        raise AssertionError(f"the attention widget drew no image within 90 s; screenshot {shot}; "
                             f"widget text: {widget.inner_text()[:500]!r}") from None


def _validate(page) -> None:
    page.locator(".validate-button").first.click()
    dialog = page.locator(".jp-Dialog")
    dialog.locator(".validation-success, .validation-failed, .validation-error").first.wait_for(timeout=150_000)
    text = dialog.inner_text()
    assert "Success! Your notebook passes all the tests." in text, f"Validate did not pass:\n{text[:2000]}"
    dialog.locator("button", has_text="OK").first.click()


def _camp_in_a_terminal(page, out: Path) -> None:
    """File > New > Terminal, type a command: `camp`, `nbgrader` and `alembic` resolve to the venv."""
    type_in_a_new_terminal(page, f"(command -v camp nbgrader alembic; camp list) > {out} 2>&1; exit")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (out.exists() and re.search(rf"^{LAB}\s", out.read_text(), re.M)):
        time.sleep(0.3)
    text = out.read_text() if out.exists() else "(nothing written)"
    venv_bin = str(Path(sys.executable).parent)
    assert all(f"{venv_bin}/{tool}" in text for tool in ("camp", "nbgrader", "alembic")), text
    assert re.search(rf"^{LAB}\s+basic", text, re.M), f"`camp list` in the terminal printed:\n{text}"


def _no_news_prompt(page, lab) -> None:
    """The course's settings answer JupyterLab's "get notified about official Jupyter news?" with
    no (course/jupyter/everyone): the setting as the server serves it, and no prompt on screen."""
    page.wait_for_function(
        """async (url) => { const r = await fetch(url); const s = await r.json();
                            return s.composite && s.composite.fetchNews === "false"; }""",
        arg=lab.url("/lab/api/settings/@jupyterlab/apputils-extension:notification"), timeout=10_000)
    time.sleep(3)   # the prompt, when asked for, shows within a second or two of the page
    assert "official Jupyter news" not in page.locator("body").inner_text()


def _nbgrader_menu(page) -> list[str]:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Nbgrader$")).click()
    items = page.locator(".lm-Menu-content .lm-Menu-item:visible .lm-Menu-itemLabel")
    items.first.wait_for()
    labels = [t.strip() for t in items.all_inner_texts()]
    page.keyboard.press("Escape")
    return labels


def _formgrader_lists_the_lab(page, lab) -> tuple[str, str]:
    """Formgrader's assignment list: the lab's (status, number of submissions)."""
    page.goto(lab.url("/formgrader/manage_assignments"))
    page.locator("#main-table a", has_text=LAB_NAME).first.wait_for()
    assert "nbgrader will not work correctly" not in page.content()
    warnings = page.locator("#warning-exchange, #warning-course-id")
    assert warnings.count() == 0, f"Formgrader: {warnings.first.inner_text()}"   # release/collect available
    row = page.locator("#main-table tr", has=page.locator("a", has_text=LAB_NAME)).first
    return row.locator(".status").inner_text().strip(), row.locator(".num-submissions").inner_text().strip()


def _formgrader_shows_the_graded_submission(page, lab, workspace: Path) -> None:
    page.goto(lab.url(f"/formgrader/manage_submissions/{LAB_NAME}"))
    row = page.locator("tr", has=page.locator(".student-id", has_text=STUDENT))
    row.wait_for()
    assert row.locator(".status").inner_text().strip() == "graded", row.inner_text()
    assert row.locator(".score").inner_text().strip() == "12 / 12", row.inner_text()
    # the time it was turned in (the upload's, recorded by camp grade in collected/) and a name
    uploaded = (workspace / "collected" / STUDENT / LAB_NAME / "timestamp.txt").read_text()[:19]
    assert row.locator(".timestamp").inner_text().strip().startswith(uploaded), (uploaded, row.inner_text())
    assert "None" not in row.locator(".student-name").inner_text(), row.inner_text()
    # manual grading opens the autograded notebook (autograded/<student>/<lab>/ in the workspace)
    page.goto(lab.url(f"/formgrader/gradebook/{LAB_NAME}/{LAB_NAME}"))
    with page.expect_response(lambda r: "jupyter_server_mathjax/MathJax.js" in r.url) as mathjax:
        page.locator("a", has_text="Submission #1").first.click()
    assert mathjax.value.status == 200 and mathjax.value.url.startswith(lab.base), mathjax.value.url
    page.locator("text=camp grade:").first.wait_for()
    assert "not found" not in page.title().lower(), page.title()
    page.wait_for_function("() => window.MathJax && window.MathJax.Hub", timeout=30_000)
