"""The README's claim about `make test` (how many tests, how many minutes), kept honest.

The README holds it between markers, `<!-- make-test -->N tests in A-B minutes<!-- /make-test -->`.
After a full run (the whole suite: no file, -k or -m selection; what `make test` does),
tests/conftest.py compares it with what the run printed: a different count fails the run under
CI (update the README with the printed numbers) and is a warning elsewhere; minutes outside A-B
are always only a warning (machines differ), printed with the measured figure.
"""
from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
CLAIM = re.compile(r"<!-- make-test -->(\d+) tests in (\d+(?:\.\d+)?)[-–](\d+(?:\.\d+)?) minutes<!-- /make-test -->")


def readme_claim(readme: Path = README) -> tuple[int, float, float]:
    """(tests, minutes at least, minutes at most) as the README states them."""
    m = CLAIM.search(readme.read_text(encoding="utf-8"))
    if not m:
        raise ValueError(f"{readme} has no `{CLAIM.pattern}` claim about make test")
    return int(m.group(1)), float(m.group(2)), float(m.group(3))


def full_run(args: list[str], keyword: str, markexpr: str, testpaths: list[str]) -> bool:
    """Whether pytest ran the whole suite: no -k, no -m, no paths other than the testpaths."""
    return not keyword and not markexpr and all(a.rstrip("/") in testpaths for a in args)


def compare(claim: tuple[int, float, float], tests: int, minutes: float) -> tuple[str, str]:
    """(count problem, time note): empty strings when the README is right."""
    count, low, high = claim
    problem = (f"README.md says {count} tests, this run ran {tests}: update its `<!-- make-test -->` claim "
               f"(and the minutes: this run took {minutes:.1f})") if tests != count else ""
    note = (f"README.md says {low:g}-{high:g} minutes for make test, this run took {minutes:.1f} "
            "(update it if this machine is the reference)") if not low <= minutes <= high else ""
    return problem, note
