"""The browser for tests/browser: Debian's Chromium (`make test` installs it when missing and
root), driven by Playwright; nothing is ever downloaded. Without one the tests are not run, and
say so: a skip with the reason (listed in pytest's summary, -ra) and a warning; under CI
(CI=true), where `make test` must have installed it, they fail instead."""
import os
import re
import shutil

import pytest

from tests.support import not_run

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")


def _not_run(reason: str):
    not_run(f"BROWSER TESTS NOT RUN: {reason}", " (CI must run them: `make test` installs Debian's chromium as root)")


@pytest.fixture(scope="session")
def chromium_path() -> str:
    chosen = os.environ.get("CAMP_CHROMIUM")
    path = chosen or next((p for p in CHROMIUM_CANDIDATES if os.access(p, os.X_OK)), None) or shutil.which("chromium")
    if not path or not os.access(path, os.X_OK):
        _not_run("no Chromium executable (apt-get install chromium, or set CAMP_CHROMIUM)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        _not_run(f"Playwright is not installed ({exc})")
    return path


@pytest.fixture
def browser_page(chromium_path):
    """A fresh headless Chromium page; closed (and its processes ended) when the test ends."""
    from playwright.sync_api import Error, sync_playwright

    with sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=chromium_path, headless=True)
        except Error as exc:
            _not_run(f"Chromium at {chromium_path} did not start: {str(exc).splitlines()[0]}")
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(30_000)
            yield page
        finally:
            browser.close()


def type_in_a_new_terminal(page, command: str) -> None:
    """JupyterLab's File > New > Terminal, then `command` typed into it (end it with `; exit`)."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^File$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^New$")).hover()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Terminal$")).click()
    term = page.locator(".jp-Terminal").last
    term.wait_for()
    term.click()
    page.keyboard.type(command + "\n", delay=5)


def typeset_formulas(page, timeout_s: float = 30) -> dict:
    """Wait until MathJax has typeset every formula of a camp page (each `span.camp-math` holds a
    <math> element: reports/mathjax.py draws MathML), polling, since the page's policy refuses the
    eval that wait_for_function needs; then what the reader sees: how many formulas, how many
    typeset, and the visible text of those still showing TeX (`\\(`, `\\[` or `$`)."""
    import time

    count = ("(() => { const s = [...document.querySelectorAll('span.camp-math')];"
             " return [s.length, s.filter(e => e.querySelector('math')).length]; })()")
    deadline = time.monotonic() + timeout_s
    spans, typeset = page.evaluate(count)
    while not (spans and typeset == spans) and time.monotonic() < deadline:
        page.wait_for_timeout(100)
        spans, typeset = page.evaluate(count)
    raw = page.evaluate("[...document.querySelectorAll('span.camp-math')].map(s => s.innerText)"
                        ".filter(t => t.includes('\\\\(') || t.includes('\\\\[') || t.includes('$'))")
    return {"formulas": spans, "typeset": typeset, "raw": raw}
