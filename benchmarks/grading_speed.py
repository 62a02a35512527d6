"""Benchmark: wall time to grade a class of 8 b01 submissions (the platform issue's yardstick).

Side by side in one run, on the same machine and the same submissions:
  1. plain nbgrader autograde, serial, through its API (what nbgrader alone offers);
  2. camp grade --jobs 1 (sandboxed, tests outside the student's process);
  3. camp grade --jobs N (N = cores by default).
Prints seconds and ratios, and checks that all three give the same scores.

  .venv/bin/python benchmarks/grading_speed.py [--students 8] [--jobs N]
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from autograder.catalog import Catalog, repo_root
from autograder.course.nbgrader_setup import nbgrader_api, nbgrader_config
from autograder.course.reference import student_notebook, write_submission
from autograder.grading.grade import GradeOptions, grade

LAB = "b01"
WRONG_MASKS = "def causal_mask(L, S=None, device=None):\n    return torch.ones(L, L if S is None else S, dtype=torch.bool)\n" \
              "def padding_mask(lengths, S):\n    raise NotImplementedError\n"


def make_class(subs: Path, n: int) -> None:
    for i in range(n):
        kind = ("reference", "blank", "partial")[i % 3]
        nb = {"reference": student_notebook(LAB), "blank": student_notebook(LAB, solve=False),
              "partial": student_notebook(LAB, {"masks": WRONG_MASKS})}[kind]
        write_submission(subs, f"s{i:02d}_{kind}", LAB, nb)


def nbgrader_serial(subs: Path, ws: Path) -> dict[str, float]:
    from nbgrader.api import Gradebook
    lab = Catalog.load().get(LAB)
    shutil.copytree(lab.source_path(repo_root()).parent, ws / "source" / lab.name)
    shutil.copytree(subs, ws / "submitted")
    api = nbgrader_api(nbgrader_config(ws, cell_timeout=lab.cell_timeout))
    assert api.generate_assignment(lab.name)["success"]
    for student in sorted(p.name for p in subs.iterdir()):
        api.autograde(lab.name, student)
    with Gradebook(f"sqlite:///{ws / 'gradebook.db'}") as gb:
        return {s.student.id: float(s.score) for s in gb.assignment_submissions(lab.name)}


def camp(subs: Path, ws: Path, jobs: int) -> dict[str, float]:
    rows = grade(subs, Catalog.load(), repo_root(), ws, None, GradeOptions(jobs=jobs))
    return {r.student: r.score for r in rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--students", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--skip-nbgrader", action="store_true", help="only the two camp runs")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="camp-bench-"))
    make_class(tmp / "subs", args.students)
    timings, scores = {}, {}
    runs = [("nbgrader autograde, serial", lambda: nbgrader_serial(tmp / "subs", tmp / "nbgrader")),
            ("camp grade --jobs 1", lambda: camp(tmp / "subs", tmp / "camp1", 1)),
            (f"camp grade --jobs {args.jobs}", lambda: camp(tmp / "subs", tmp / "campN", args.jobs))]
    for name, fn in runs[args.skip_nbgrader:]:
        start = time.perf_counter()
        scores[name] = fn()
        timings[name] = time.perf_counter() - start
        print(f"{name:32s} {timings[name]:7.1f} s  ({timings[name] / args.students:.2f} s per submission)", flush=True)
    one = timings["camp grade --jobs 1"]
    many = timings[f"camp grade --jobs {args.jobs}"]
    if "nbgrader autograde, serial" in timings:
        print(f"\nspeed-up of camp --jobs {args.jobs} over serial nbgrader: {timings['nbgrader autograde, serial'] / many:.2f}x")
    print(f"speed-up of camp --jobs {args.jobs} over camp --jobs 1: {one / many:.2f}x "
          f"(ideal {args.jobs}x on {os.cpu_count()} cores)")
    same = len({tuple(sorted(s.items())) for s in scores.values()}) == 1
    print("scores identical across the three runs:", same)
    if not same:
        for name, s in scores.items():
            print(name, s)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
