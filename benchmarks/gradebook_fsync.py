"""What sqlite's fsync costs the gradebook work of the test suite (tests/conftest.py turns it off
in the test processes with `PRAGMA synchronous=OFF`), side by side in one run, alternating: the
nbgrader gradebook work of one `camp grade` call (registering a lab with generate_assignment,
then recording `--results` results) and a `camp build` of `--labs` labs, each with sqlite's
default and without fsync. Prints seconds, the commits made, and the ratios.

    .venv/bin/python benchmarks/gradebook_fsync.py [--rounds 2] [--lab b01] [--results 8] [--labs 3]
"""
from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time
from pathlib import Path

import autograder  # noqa: F401  (first: camp's processes skip jsonschema's IRI grammar)
from sqlalchemy import event
from sqlalchemy.engine import Engine

from autograder.catalog import Catalog, repo_root
from autograder.course.release import release_labs
from autograder.grading.grade import _install_source
from autograder.grading.results import SubmissionResult, TestOutcome
from autograder.reports.gradebook import record

COMMITS = [0]


def _no_fsync(dbapi_connection, _record):
    if isinstance(dbapi_connection, sqlite3.Connection):
        dbapi_connection.execute("PRAGMA synchronous=OFF")


def _count(_connection):
    COMMITS[0] += 1


def one_round(lab, labs, n_results: int, root: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix="camp-fsync-"))
    out = work / "ws"
    out.mkdir()
    timings = {}
    COMMITS[0] = 0
    start = time.perf_counter()
    spec = _install_source(lab, root, out)
    for i in range(n_results):
        result = SubmissionResult(f"s{i}", lab.id, "graded", max_score=spec.max_score,
                                  tests=[TestOutcome(t.grade_id, t.points, t.points, "") for t in spec.tests])
        record(out / "gradebook.db", lab.name, Path(lab.notebook).stem, result)
    timings["grade"] = (time.perf_counter() - start, COMMITS[0])
    COMMITS[0] = 0
    start = time.perf_counter()
    release_labs(labs, root, work / "release")
    timings["build"] = (time.perf_counter() - start, COMMITS[0])
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lab", default="b01")
    parser.add_argument("--results", type=int, default=8)
    parser.add_argument("--labs", type=int, default=3, help="labs built (the first N ready ones)")
    args = parser.parse_args()
    catalog, root = Catalog.load(), repo_root()
    lab, labs = catalog.get(args.lab), catalog.ready()[:args.labs]
    event.listen(Engine, "commit", _count)
    one_round(lab, labs, args.results, root)   # imports and page cache, not counted
    sums = {(side, part): 0.0 for side in ("fsync", "no fsync") for part in ("grade", "build")}
    for r in range(args.rounds):
        for side in ("fsync", "no fsync"):
            if side == "no fsync":
                event.listen(Engine, "connect", _no_fsync)
            try:
                timings = one_round(lab, labs, args.results, root)
            finally:
                if side == "no fsync":
                    event.remove(Engine, "connect", _no_fsync)
            for part, (seconds, commits) in timings.items():
                sums[side, part] += seconds
                print(f"round {r}, {side:>8}: {part:<5} {seconds:6.2f} s, {commits} commits")
    print(f"load average {os.getloadavg()[0]:.1f}")
    for part, what in (("grade", f"register {lab.id} + record {args.results} results"),
                       ("build", f"build {len(labs)} labs")):
        a, b = sums["fsync", part] / args.rounds, sums["no fsync", part] / args.rounds
        print(f"{what}: {a:.2f} s with fsync, {b:.2f} s without: {a / b:.2f}x, {a - b:.2f} s saved")


if __name__ == "__main__":
    main()
