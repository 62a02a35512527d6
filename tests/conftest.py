"""Fixtures every test gets.

- one intra-op thread per test process, and (OMP_NUM_THREADS) per process they start (`camp
  grade`'s workers and sandboxes too: autograder.grading.grade caps their threads by it): the suite
  runs on 2 cores (pytest-xdist workers, notebook kernels, rank processes, sandboxes); tiny
  matmuls only lose by waiting for a busy core, and OpenMP threads spinning for a core the other
  worker holds made lab notebooks 2-5x slower (a01's ci run: 16 s with one thread, up to 69 s
  with two beside a busy worker), so a lab's ci budget is measured on one core;
- no process left behind: a test that starts ranks, sandboxes or servers must end them;
- `CAMP_FAKE_CPU=avx512bf16` (tests/fake_cpu) runs the suite, and the processes it starts (not
  the grading sandbox's, which get the sandbox's own environment), as on a CPU with those flags.
"""
import os
import sys
from pathlib import Path

import pytest
import torch


FAKE_CPU = Path(__file__).parent / "fake_cpu"


def pytest_configure(config):
    os.environ["OMP_NUM_THREADS"] = "1"
    if os.environ.get("CAMP_FAKE_CPU") and "sitecustomize" not in sys.modules:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAKE_CPU), os.environ.get("PYTHONPATH")]))
        sys.path.insert(0, str(FAKE_CPU))
        import sitecustomize  # noqa: F401  (this process too: workers and the tests' own imports)
    torch.set_num_threads(1)
    # Triton decides at its first import whether it interprets (CPU) or compiles (CUDA), and
    # torch._dynamo, peft and bitsandbytes import it: whichever test ran first decided for the
    # worker, so a09's kernel tests failed when a worker had compiled or imported peft before
    # (seen with one worker). camplib.kernels.triton_flash says so when it happens to a student.
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    _sqlite_without_fsync()


def _sqlite_without_fsync():
    """nbgrader's gradebooks written by this process (each `camp grade` workspace, each build's
    throwaway one) skip fsync: `PRAGMA synchronous=OFF`. A commit is otherwise 3-4 fdatasyncs,
    ~20 ms on this disk: grading 8 b01 submissions made 384 of them, and `camp build` of the 18
    labs ~470 commits, ~10 s of its 22 s (test_release builds them three times). Side by side
    (load ~7): registering a lab 0.93 -> 0.27 s, recording 8 results 1.11 -> 0.66 s, building 3
    labs 2.7 -> 1.1 s; test_release's two full-build tests 53 + 38 -> 25 + 20 s. Waits, not CPU:
    they held a worker while its core idled. Readers, locking and the data written are the same
    (handed to the OS at each commit, safe if the process dies); only an OS crash or power cut
    could lose the last commits, which no test looks at. `camp grade` and `camp build` keep
    sqlite's default outside the tests."""
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "connect")
    def _no_fsync(dbapi_connection, _record):
        if isinstance(dbapi_connection, sqlite3.Connection):
            dbapi_connection.execute("PRAGMA synchronous=OFF")


# multiprocessing's own helpers live as long as the test process, by design
LONG_LIVED = (b"multiprocessing.resource_tracker", b"multiprocessing.forkserver")


def child_processes() -> set[int]:
    """Live or zombie processes whose parent is this test process (multiprocessing's resource
    tracker and fork server excepted). Every process's /proc/<pid>/stat is read, twice per test:
    plain os calls, not pathlib (half the CPU: ~1.6 ms instead of 3 ms with ~100 processes)."""
    me, kids = os.getpid(), set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split(None, 2)   # state, ppid, the rest
        except OSError:
            continue
        if int(fields[1]) != me:
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            cmdline = b""
        if not any(long_lived in cmdline for long_lived in LONG_LIVED):
            kids.add(int(name))
    return kids


@pytest.fixture(autouse=True)
def no_leftover_processes():
    before = child_processes()
    yield
    left = child_processes() - before
    assert not left, f"the test left processes behind: {sorted(left)}"


def pytest_collection_modifyitems(config, items):
    """How `make test` shares the tests between its xdist workers (`--dist loadgroup
    --no-loadscope-reorder`): a work unit goes to whichever worker is free, in this order, long
    tests first, so the slow ones (lab notebooks, grading round trips) start at once instead of
    forming a tail at the end. A unit is one test, except that the tests of a module sharing a
    module-scoped fixture (grading a hostile class, a trained tokenizer) form one unit, so that
    fixture runs once (pytest_itemcollected marks them). xdist's default `load` instead hands each
    worker a consecutive block of this list up front: one worker got nearly every slow test and
    ran alone for the last 9 minutes."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_itemcollected(item):
    # here, not in pytest_collection_modifyitems: xdist turns the groups into work units in that
    # hook, and ran its own before ours
    if _shares_a_module_fixture(item):
        item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def _shares_a_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values())


def pytest_collection_finish(session):
    """Fail loudly if xdist stopped honouring the groups (pytest 9.2 with xdist 3.8 did, silently)."""
    if getattr(session.config.option, "loadgroup", False):
        grouped = [i for i in session.items if i.get_closest_marker("xdist_group")]
        if grouped and "@" not in grouped[0].nodeid:
            raise pytest.UsageError("pytest-xdist's --dist loadgroup is not grouping tests with this pytest "
                                    f"{pytest.__version__}: module fixtures would run on every worker "
                                    "(pyproject.toml pins a pytest that works)")


def pytest_sessionstart(session):
    import time
    session.config._camp_started = time.monotonic()


def pytest_sessionfinish(session, exitstatus):
    """After a full run, the README's `make test` claim against what ran (tests/readme_claims.py):
    a wrong count fails the run under CI; the minutes are a note. Runs in xdist's controller only
    (the workers see a share of the tests)."""
    import time

    from tests.readme_claims import compare, full_run, readme_claim

    config = session.config
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or hasattr(config, "workerinput") or exitstatus not in (0, 1):
        return
    if not full_run(list(config.args), config.option.keyword, config.option.markexpr, config.getini("testpaths")):
        return
    ran = {r.nodeid for key in ("passed", "failed", "skipped", "xfailed", "xpassed", "error")
           for r in reporter.stats.get(key, []) if getattr(r, "nodeid", "")}
    minutes = (time.monotonic() - getattr(config, "_camp_started", time.monotonic())) / 60
    problem, note = compare(readme_claim(), len(ran), minutes)
    if problem or note:
        reporter.ensure_newline()
    for line in filter(None, (problem, note)):
        reporter.write_line(f"README CLAIM: {line}", yellow=True, bold=True)
    if problem and os.environ.get("CI"):
        session.exitstatus = 1
