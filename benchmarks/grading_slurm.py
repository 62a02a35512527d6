"""Benchmark: one synthetic class graded here and through Slurm with 1, 2 and 4 worker slots.

The class: `--students` submissions spread over `--labs` (default b01 and b05), in four kinds
per lab: the reference solution, a typical mistake (tests/course/mistakes: the lab's first),
a blank notebook, and a hostile one (it tries to overwrite a classmate's result in the grading
workspace, then kills its own process mid-notebook). b01's kinds are benchmarks/grading_speed.py's
class plus the hostile one.

Each run is `camp grade` in a fresh process, as an instructor runs it, into a fresh workspace,
with the same hidden-case seed: `--jobs 2` on this machine's cores (local), then `--on slurm
--jobs S --shards S` for S = 1, 2, 4 through the one-node Slurm of course/slurm (started here if
needed; root only). Prints wall seconds, the ratio of each Slurm run to the 1-slot one, and
whether all runs gave the same scores test by test. The Slurm node declares 4 CPUs whatever the
machine has: with fewer cores, the 4-slot run shares them (the ratio then measures contention,
not the cluster's scaling); the load average before and after says how busy the machine was.

  .venv/bin/python benchmarks/grading_slurm.py [--students 64] [--labs b01 b05] [--slots 1 2 4]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autograder.catalog import Catalog, repo_root
from autograder.course.reference import student_notebook, write_submission

ROOT = repo_root()
sys.path.insert(0, str(ROOT))
from tests.course.mistakes import mistakes_of  # noqa: E402
from tests.autograder.grading.test_attacks import _cell  # noqa: E402

SEED = 1234


def hostile(lab_id: str, workspace_glob: str):
    """The reference, plus a cell that tries to overwrite every result file it can find in any
    grading workspace and then exits its process (os._exit)."""
    lab = Catalog.load().get(lab_id)
    nb = student_notebook(lab_id)
    first_solution = next(c.metadata["nbgrader"]["grade_id"] for c in nb.cells
                          if c.metadata.get("nbgrader", {}).get("solution"))
    attack = ("import glob, os\n"
              f"for p in glob.glob({workspace_glob!r} + '/results/*/*.json'):\n"
              "    try:\n        open(p, 'w').write('{}')\n    except OSError:\n        pass\n"
              "os._exit(3)\n")
    return _cell(nb, first_solution, attack), lab


def make_class(subs: Path, n: int, labs: list[str], workspaces: Path) -> None:
    kinds = ("reference", "mistake", "blank", "hostile")
    for i in range(n):
        lab_id, kind = labs[i % len(labs)], kinds[(i // len(labs)) % len(kinds)]
        if kind == "reference":
            nb = student_notebook(lab_id)
        elif kind == "blank":
            nb = student_notebook(lab_id, solve=False)
        elif kind == "mistake":
            m = mistakes_of(lab_id)[0]
            nb = student_notebook(lab_id, {m.grade_id: m.code()})
        else:
            nb, _ = hostile(lab_id, str(workspaces / "*"))
        write_submission(subs, f"s{i:03d}_{kind}", lab_id, nb)


def camp(subs: Path, ws: Path, extra: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "autograder.cli", "grade", str(subs), "--out", str(ws),
                    "--seed", str(SEED), *extra], check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def per_test(ws: Path) -> dict:
    out = {}
    for path in sorted((ws / "results").glob("*/*.json")):
        r = json.loads(path.read_text())["result"]
        out[(r["lab"], r["student"])] = [(t["grade_id"], t["score"], t["message"]) for t in r["tests"]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--students", type=int, default=64)
    parser.add_argument("--labs", nargs="+", default=["b01", "b05"])
    parser.add_argument("--slots", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--local-jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    start = subprocess.run([str(ROOT / "course" / "slurm" / "start.sh")], capture_output=True, text=True)
    if start.returncode != 0:
        sys.exit(f"no one-node Slurm here: {start.stderr.strip()}")
    env = {**os.environ, "SLURM_CONF": start.stdout.strip().split("=", 1)[1]}
    tmp = Path(tempfile.mkdtemp(prefix="camp-bench-slurm-"))
    make_class(tmp / "subs", args.students, args.labs, tmp)
    print(f"class: {args.students} submissions of {', '.join(args.labs)} (reference, mistake, blank, hostile); "
          f"{os.cpu_count()} cores; load average before: {os.getloadavg()[0]:.1f}", flush=True)
    runs = [(f"local, camp grade --jobs {args.local_jobs}", ["--jobs", str(args.local_jobs)])]
    runs += [(f"slurm, {s} slot(s) ({s} shard(s))", ["--on", "slurm", "--jobs", str(s), "--shards", str(s),
                                                             "--task-mem-gb", "2"])
             for s in args.slots]
    seconds, results = {}, {}
    for i, (name, extra) in enumerate(runs):
        ws = tmp / f"ws{i}"
        seconds[name] = camp(tmp / "subs", ws, extra, env)
        results[name] = per_test(ws)
        print(f"{name:38s} {seconds[name]:7.1f} s  ({seconds[name] / args.students:.2f} s per submission; "
              f"load average {os.getloadavg()[0]:.1f})", flush=True)
    base = f"slurm, {args.slots[0]} slot(s) ({args.slots[0]} shard(s))"
    print()
    for name, s in seconds.items():
        print(f"{name:38s} {seconds[base] / s:5.2f}x the speed of the {args.slots[0]}-slot Slurm run")
    same = all(r == results[runs[0][0]] for r in results.values())
    print(f"\nsame scores and messages, test by test, in every run: {same} "
          f"({len(results[runs[0][0]])} results each)")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    shutil.rmtree(tmp, ignore_errors=True)
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
