"""Fixtures every test gets.

- one intra-op thread per test process, and (OMP_NUM_THREADS) per process they start: the suite
  runs on 2 cores (pytest-xdist workers, notebook kernels, rank processes, sandboxes); tiny
  matmuls only lose by waiting for a busy core, and OpenMP threads spinning for a core the other
  worker holds made lab notebooks 2-5x slower (a01's ci run: 16 s with one thread, up to 69 s
  with two beside a busy worker), so a lab's ci budget is measured on one core;
- no process left behind: a test that starts ranks, sandboxes or servers must end them.
"""
import os
from pathlib import Path

import pytest
import torch


def pytest_configure(config):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


# multiprocessing's own helpers live as long as the test process, by design
LONG_LIVED = (b"multiprocessing.resource_tracker", b"multiprocessing.forkserver")


def child_processes() -> set[int]:
    """Live or zombie processes whose parent is this test process (multiprocessing's resource
    tracker and fork server excepted)."""
    me, kids = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) != me:
            continue
        try:
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            cmdline = b""
        if not any(name in cmdline for name in LONG_LIVED):
            kids.add(int(stat.parent.name))
    return kids


@pytest.fixture(autouse=True)
def no_leftover_processes():
    before = child_processes()
    yield
    left = child_processes() - before
    assert not left, f"the test left processes behind: {sorted(left)}"


def pytest_collection_modifyitems(config, items):
    """Long tests first: with pytest-xdist each worker takes tests in this order, so the slow
    ones (lab notebooks, grading round trips) start at once instead of forming a tail at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
