"""The `camp` command: the course's one entry point for instructors and CI.

  camp list                          the ladder
  camp build [LAB ...] [--check]     release labs/ from solutions/ (nbgrader)
  camp run [LAB ...] [--profile ci|gpu] [-p NAME VALUE ...] [--out DIR]
  camp grade SUBMISSIONS_DIR [--lab LAB] [--out DIR] [--jobs N] [--isolation auto|bwrap|none]
             [--on slurm [--shards N] [--partition P] [--task-minutes M] [--cpus-per-task C] [--task-mem-gb G] [--sbatch OPT]]
  camp start LAB                     a student's own copy of a lab, in work/<lab>/
  camp check NOTEBOOK                a student's self-check
  camp serve CHECKPOINT [...]        p03's OpenAI-compatible server (= python -m camplib.serving)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .catalog import LEVELS, Catalog, repo_root
from .text import format_table, inert


def cmd_list(args, catalog: Catalog, root: Path) -> int:
    print(ladder_markdown(catalog) if args.markdown else ladder_table(catalog))
    return 0


def _ladder_rows(catalog: Catalog) -> list[list[str]]:
    return [[lab.id, lab.level, lab.title, ", ".join(lab.requires) or "-", f"{lab.minutes} min", lab.status]
            for level in LEVELS for lab in catalog.labs if lab.level == level]


LADDER_HEADERS = ["id", "level", "title", "requires", "time", "status"]


def ladder_table(catalog: Catalog) -> str:
    return format_table(LADDER_HEADERS, _ladder_rows(catalog))


def ladder_markdown(catalog: Catalog) -> str:
    """The course map as the README shows it (tests/autograder/test_cli_list.py keeps them equal)."""
    rows = _ladder_rows(catalog)
    total = sum(lab.minutes for lab in catalog.labs)
    lines = ["| " + " | ".join(LADDER_HEADERS) + " |", "|" + "---|" * len(LADDER_HEADERS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    ready = [lab for lab in catalog.labs if lab.status == "ready"]
    lines.append(f"\n{len(ready)} of {len(catalog.labs)} labs ready; about {total / 60:.0f} hours in all.")
    return "\n".join(lines)


def cmd_build(args, catalog: Catalog, root: Path) -> int:
    from .course.release import BuildError, check_release, release_labs

    labs = catalog.select(args.labs)
    try:
        if args.check:
            problems = check_release(labs, root)
            for p in problems:
                print(f"STALE OR LEAKING  {p}")
            if problems:
                return 1
            print(f"labs/ is up to date for {', '.join(l.id for l in labs)}; no solution code or hidden tests released")
            return 0
        release_labs(labs, root, root / "labs")
    except BuildError as exc:
        print(f"build failed: {exc}", file=sys.stderr)
        return 1
    for lab in labs:
        print(f"released {lab.id} -> {lab.release_path(root).relative_to(root)}")
    return 0


def cmd_run(args, catalog: Catalog, root: Path) -> int:
    from .course.execute import parse_value, run_lab

    overrides = {name: parse_value(value) for name, value in args.param}
    out = Path(args.out or root / "runs" / args.profile).resolve()
    results = []
    for lab in catalog.select(args.labs):
        result = run_lab(lab, root, out, args.profile, overrides, args.cell_timeout)
        print(f"{lab.id}: {'ok' if result.ok else 'FAILED'} in {result.seconds:.1f} s", flush=True)
        results.append(result)
    print()
    print(format_table(["lab", "profile", "seconds", "status", "note"],
                       [[r.lab, r.profile, f"{r.seconds:.1f}", "ok" if r.ok else "FAILED", r.message] for r in results]))
    print(f"\nexecuted notebooks are in {out}")
    return 0 if all(r.ok for r in results) else 1


def cmd_grade(args, catalog: Catalog, root: Path) -> int:
    from .grading.pool import start_fork_server

    try:   # first: the workers' imports then run while this process does its own
        labs = [catalog.get(args.lab)] if args.lab else catalog.ready()
        if args.on == "local":   # on Slurm the workers start in the array's tasks
            start_fork_server([str(lab.source_path(root)) for lab in labs])
    except Exception:
        pass   # grade() starts it, reporting any real problem
    from .course.nbgrader_setup import grading_workspace
    from .grading.grade import GradeOptions, grade
    from .grading.readiness import GradingSetupError

    subs = Path(args.submissions)
    if not subs.is_dir():
        print(f"camp grade: {subs} is not a folder of submissions", file=sys.stderr)
        return 2
    out = Path(args.out).resolve() if args.out else grading_workspace(root)
    if out == root or root / "solutions" in (out, *out.parents):
        print("camp grade: --out must not be the repository or inside solutions/", file=sys.stderr)
        return 2
    try:
        from .grading.engine import new_seed
        seed = new_seed() if args.seed is None else args.seed
        options = GradeOptions(jobs=args.jobs, isolation=args.isolation, regrade=args.regrade, seed=seed,
                               on=args.on, slurm=_slurm_options(args) if args.on == "slurm" else None)
        rows = grade(subs, catalog, root, out, args.lab, options)
    except (GradingSetupError, KeyError) as exc:
        print(f"camp grade: {inert(exc, 2000)}", file=sys.stderr)
        return 2
    except Exception as exc:  # a grader bug stopped the run: the grade sheet holds what was finished
        print(f"camp grade: grading stopped by an unexpected error ({type(exc).__name__}: {inert(exc, 2000)}); "
              f"{out / 'grades.csv'} lists what was graded and the rest as grader errors", file=sys.stderr)
        return 1
    print(format_table(["student", "lab", "score", "max", "status", "message"],
                       [[r.student, r.lab, f"{r.score:g}", f"{r.max_score:g}", r.status, r.message] for r in rows]))
    print(f"\nhidden cases of this run used seed {seed} (recorded in each result; results kept from an "
          f"earlier run keep theirs): `camp grade --seed {seed} --regrade` grades with the same cases")
    print(f"\ngrades: {out / 'grades.csv'}   report: {out / 'report.html'}   feedback: {out / 'feedback'}")
    from .reports.similarity import summary_line
    print(summary_line(out))
    failed = [r for r in rows if r.grader_failed]
    if failed:  # the grader's fault, not the students': the instructor must look (students' failures exit 0)
        print(f"\ncamp grade: the grader failed on {len(failed)} submission(s); run again to retry them:",
              file=sys.stderr)
        for r in failed:
            print(f"  {inert(r.student, 80)} {inert(r.lab, 40)}: {inert(r.message, 300)}", file=sys.stderr)
        return 1
    return 0


def _slurm_options(args):
    from .grading.slurm import SlurmOptions
    return SlurmOptions(shards=args.shards, partition=args.partition, minutes=args.task_minutes,
                        cpus_per_task=args.cpus_per_task, mem_gb=args.task_mem_gb, extra=tuple(args.sbatch))


def cmd_check(args, catalog: Catalog, root: Path) -> int:
    from .course.selfcheck import check_notebook

    path = Path(args.notebook)
    if not path.is_file():
        print(f"camp check: no such notebook {path}", file=sys.stderr)
        return 2
    problems, results = check_notebook(path, catalog, root)
    for p in problems:
        print(f"NOTE  {p}")
    for r in results:
        first, *rest = r.message.splitlines() or [""]
        print(f"{'PASS' if r.passed else 'FAIL'}  {r.grade_id} ({r.points:g} pts){'  ' + inert(first) if first else ''}")
        for line in rest:   # where: the student's cell and line (autograder.tracebacks)
            print(f"      {inert(line)}")
    earned = sum(r.points for r in results if r.passed)
    total = sum(r.points for r in results)
    print(f"\nvisible tests: {sum(r.passed for r in results)}/{len(results)} cells passed, {earned:g}/{total:g} points"
          " (hidden tests run when your notebook is graded)")
    from .course.selfcheck import NOT_CHECKED
    print(f"NOTE  {NOT_CHECKED}")
    return 0 if results and all(r.passed for r in results) and not problems else 1


def cmd_start(args, catalog: Catalog, root: Path) -> int:
    from .course.start import StartError, start_lab

    lab = catalog.get(args.lab)
    try:
        notebook = start_lab(lab, root, Path(args.into).resolve() if args.into else None)
    except StartError as exc:
        print(f"camp start: {exc}", file=sys.stderr)
        return 1
    shown = notebook.relative_to(root) if notebook.is_relative_to(root) else notebook
    print(f"your copy of {lab.id}: {shown}\n"
          f"work there (camp build and git pull never touch it), then check it with:\n"
          f"  .venv/bin/camp check {shown}")
    return 0


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="camp", description="LLM Camp course tooling.")
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="show the ladder: labs, levels, prerequisites, status")
    listing.add_argument("--markdown", action="store_true", help="as the README's course map (a Markdown table)")
    p = sub.add_parser("build", help="release student notebooks into labs/ from solutions/ (nbgrader)")
    p.add_argument("labs", nargs="*", metavar="LAB", help="lab ids or names (default: every ready lab)")
    p.add_argument("--check", action="store_true", help="fail if labs/ is stale or leaks solutions/hidden tests")
    p = sub.add_parser("run", help="execute solution notebooks with papermill")
    p.add_argument("labs", nargs="*", metavar="LAB")
    p.add_argument("--profile", choices=["ci", "gpu"], default="ci")
    p.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="override a parameter (JSON values: 3, 0.5, true, \"cuda\")")
    p.add_argument("--out", help="folder for executed notebooks (default runs/<profile>)")
    p.add_argument("--cell-timeout", type=int, metavar="SECONDS",
                   help="each cell's limit (default: the lab's own in the ci profile, an hour in the gpu profile)")
    p = sub.add_parser("grade", help="autograde submissions into a gradebook; write grades.csv and feedback")
    p.add_argument("submissions", metavar="SUBMISSIONS_DIR", help="<student>/<lab>/<notebook>.ipynb or <student>.zip")
    p.add_argument("--lab", help="grade only this lab")
    p.add_argument("--out", help="grading workspace (default: $CAMP_GRADING_DIR, else grading/ in the "
                   "repository; Formgrader in `make lab` reads the same)")
    p.add_argument("--jobs", type=int, default=1, help="submissions graded at once (default 1); with --on slurm: "
                   "array tasks running at once")
    p.add_argument("--on", choices=["local", "slurm"], default="local",
                   help="where to grade: here (default) or as one Slurm job array (submitit), shard by shard")
    p.add_argument("--shards", type=int, help="--on slurm: tasks in the array (default: --jobs)")
    p.add_argument("--partition", help="--on slurm: the partition (default: the cluster's default)")
    p.add_argument("--task-minutes", type=int, default=60, help="--on slurm: time limit of each task (default 60)")
    p.add_argument("--cpus-per-task", type=int, default=1, help="--on slurm: cores of each task (default 1)")
    p.add_argument("--task-mem-gb", type=float, help="--on slurm: memory of each task (default: the sandbox's "
                   "memory limit + 3 GB for the grader's own process)")
    p.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                   help="--on slurm: another sbatch option, e.g. --sbatch=--account=cs101 (repeatable)")
    p.add_argument("--isolation", choices=["auto", "bwrap", "namespace", "none"], default="auto",
                   help="sandbox for student code: bwrap (root + bubblewrap; auto picks it; namespace is its old name) or none (unsafe)")
    p.add_argument("--regrade", action="store_true", help="grade again even where a result is already recorded")
    p.add_argument("--seed", type=int, default=None,
                   help="seed for the hidden cases (default: a fresh one per run; recorded in each result)")
    p = sub.add_parser("start", help="copy a released lab into work/<lab>/, your own copy to work in")
    p.add_argument("lab", metavar="LAB", help="lab id or name (b01, b01_attention)")
    p.add_argument("--into", metavar="DIR", help="folder for your copies (default work/ in the repository)")
    p = sub.add_parser("check", help="self-check a notebook: structure and visible tests")
    p.add_argument("notebook", metavar="NOTEBOOK")
    sub.add_parser("serve", add_help=False, help="serve a checkpoint over an OpenAI-compatible API "
                   "(its options: camp serve --help)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:   # every option after it belongs to camplib.serving's own parser
        from camplib.serving.__main__ import main as serve
        serve(argv[1:])
        return 0
    args = make_parser().parse_args(argv)
    root = repo_root()
    try:
        catalog = Catalog.load()
        handler = {"list": cmd_list, "build": cmd_build, "run": cmd_run, "grade": cmd_grade, "check": cmd_check,
                   "start": cmd_start}
        return handler[args.command](args, catalog, root)
    except KeyError as exc:  # unknown lab id on the command line
        print(f"camp {args.command}: {exc.args[0]}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
