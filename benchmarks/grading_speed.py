"""Benchmark: wall time to grade a class of 8 b01 submissions (the platform issue's yardstick).

Side by side in one run, on the same machine and the same submissions:
  1. plain nbgrader autograde, serial, through its API (what nbgrader alone offers);
  2. `camp grade --jobs 1` (sandboxed, tests outside the student's process);
  3. `camp grade --jobs N` (N = cores by default).
Each camp run is the command itself in a fresh process, as an instructor runs it (start-up
included), into a fresh workspace; the two camp settings alternate (1, N, N, 1, ...) over
`--rounds` rounds so that drift in the machine's load hits both alike, and each is reported as
its mean. Prints seconds and ratios, and checks that all runs give the same scores.

  .venv/bin/python benchmarks/grading_speed.py [--students 8] [--jobs N] [--rounds 2]
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autograder.catalog import Catalog, repo_root
from autograder.course.nbgrader_setup import SUBMITTED, nbgrader_api, nbgrader_config
from autograder.course.reference import student_notebook, write_submission

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
    shutil.copytree(subs, ws / SUBMITTED)   # the workspace's nbgrader "submitted" folder
    api = nbgrader_api(nbgrader_config(ws, cell_timeout=lab.cell_timeout))
    assert api.generate_assignment(lab.name)["success"]
    for student in sorted(p.name for p in subs.iterdir()):
        api.autograde(lab.name, student)
    with Gradebook(f"sqlite:///{ws / 'gradebook.db'}") as gb:
        return {s.student.id: float(s.score) for s in gb.assignment_submissions(lab.name)}


def camp(subs: Path, ws: Path, jobs: int) -> dict[str, float]:
    subprocess.run([sys.executable, "-m", "autograder.cli", "grade", str(subs), "--out", str(ws), "--jobs", str(jobs)],
                   check=True, stdout=subprocess.DEVNULL)
    with open(ws / "grades.csv", newline="") as f:
        return {row["student"]: float(row["score"]) for row in csv.DictReader(f)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--students", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--rounds", type=int, default=2, help="camp runs per setting, alternating")
    parser.add_argument("--skip-nbgrader", action="store_true", help="only the camp runs")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="camp-bench-"))
    make_class(tmp / "subs", args.students)
    one, many = "camp grade --jobs 1", f"camp grade --jobs {args.jobs}"
    runs = [] if args.skip_nbgrader else [("nbgrader autograde, serial", lambda ws: nbgrader_serial(tmp / "subs", ws))]
    for r in range(args.rounds):   # 1, N, N, 1, 1, N, ...
        pair = [(one, 1), (many, args.jobs)][:: 1 if r % 2 == 0 else -1]
        runs += [(name, lambda ws, j=jobs: camp(tmp / "subs", ws, j)) for name, jobs in pair]
    timings: dict[str, list[float]] = {}
    scores = {}
    for i, (name, fn) in enumerate(runs):
        start = time.perf_counter()
        scores[(name, i)] = fn(tmp / f"ws{i}")
        timings.setdefault(name, []).append(time.perf_counter() - start)
        print(f"{name:32s} {timings[name][-1]:7.1f} s  ({timings[name][-1] / args.students:.2f} s per submission)",
              flush=True)
    mean = {name: sum(t) / len(t) for name, t in timings.items()}
    print()
    for name, t in mean.items():
        print(f"{name:32s} mean {t:7.1f} s over {len(timings[name])} run(s)")
    if "nbgrader autograde, serial" in mean:
        print(f"\nspeed-up of camp --jobs {args.jobs} over serial nbgrader: {mean['nbgrader autograde, serial'] / mean[many]:.2f}x")
    print(f"speed-up of camp --jobs {args.jobs} over camp --jobs 1: {mean[one] / mean[many]:.2f}x "
          f"(ideal {args.jobs}x on {os.cpu_count()} cores)")
    same = len({tuple(sorted(s.items())) for s in scores.values()}) == 1
    print("scores identical across all runs:", same)
    if not same:
        for key, s in scores.items():
            print(key, s)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
