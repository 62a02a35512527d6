"""LLM Camp's course tooling: the `camp` command and the checks every lab's tests call.

Where things live (one role per folder):

| folder / file   | role                                                                        |
|-----------------|-----------------------------------------------------------------------------|
| `cli.py`        | the `camp` command: parses arguments, calls one of the modules below         |
| `catalog.py`    | `course/labs.toml` as objects: labs, profiles, forbidden APIs, grading caps  |
| `checks.py`     | what lab test cells call: `check_close`, `forward_backward`, `make` ...      |
| `text.py`       | plain-text tables and making untrusted text inert (terminal, CSV, HTML)      |
| `dependency_logs.py` | where dependencies log (bitsandbytes): the course log, never stderr |
| `tracebacks.py` | what a student sees of an exception: "cell 8, line 3", course frames folded  |
|                 | (camp check, Validate via `checks`, and the grader's student process)        |
| `course/`       | authoring: `release` (camp build), `execute` (camp run, papermill),          |
|                 | `selfcheck` (camp check), `start` (camp start: a student's own copy),        |
|                 | `labspec` (a lab read from its source notebook),                             |
|                 | `reference` (reference submissions), `nbgrader_setup`,                      |
|                 | `hub` (make hub: a class of local users on JupyterHub), `exchange_feedback`  |
| `grading/`      | the trusted side of camp grade: `grade` (a class; `readiness`: can this      |
|                 | machine grade, which isolation), `worker` (one submission                    |
|                 | in a pool process), `engine` (cells and tests), `program` (which cells run), |
|                 | `remote` + `wire` (stand-ins for the student's objects), `entries` (a      |
|                 | lab's forbidden names: aliases, resolution; both halves import it),         |
|                 | `forbid` (static scan; `computed_names`: what a name built at run time can  |
|                 | be), `observe` (runtime observer + canaries; `tripwires`: wrapped library   |
|                 | callables), `static_check` (which tests                                     |
|                 | a submission's forbidden uses cost; also run by camp check),                |
|                 | `uploads` (reading submissions under the `[grading]` caps), `results`        |
|                 | (outcomes and their store)                                                  |
| `isolation/`    | where student code runs: `sandbox` (start/stop/talk), `sandbox_init` (the    |
|                 | first program inside it), `student_process` (runs the student's cells)       |
|                 | `font_cache` (matplotlib's font list made at setup, copied into each)        |
| `reports/`      | what people read: `feedback` (per student), `class_report` (report.html),    |
|                 | `gradebook` (nbgrader's sqlite), `formgrader` (autograded/ for Formgrader),  |
|                 | `grades_csv` (grades.csv), `mathjax` (the local MathJax copy pages load)     |
"""
import sys as _sys

# jsonschema (under nbformat, which every camp process imports) loads the optional package
# `rfc3987_syntax` to check the "iri" string formats, and that package compiles a Lark grammar
# when imported: about 1.6 s of CPU in the CLI and again in the grading fork server, on every
# `camp grade`. No schema camp validates (nbformat's notebook schemas) uses those formats, and
# jsonschema treats the package as optional (it skips the check on ImportError), so camp's
# processes go without it. Nothing else imports it (tests/autograder/test_imports.py).
_sys.modules.setdefault("rfc3987_syntax", None)

# Dependencies that log about the machine (bitsandbytes on an AVX512-BF16 CPU) write to the course
# log instead of stderr, where nbgrader would score a right answer 0: before any lab cell imports
# them, since every lab's setup cell imports autograder.checks.
from autograder import dependency_logs as _dependency_logs  # noqa: E402

_dependency_logs.route()
