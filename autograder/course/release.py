"""`camp build`: release student notebooks from solutions/ into labs/ with nbgrader.

nbgrader's generate_assignment does the work (solution blocks replaced, hidden tests removed,
outputs cleared, checksums added); then the "How to work" block generated from course/labs.toml
goes in after the title cell (howto.py); `--check` rebuilds into a temporary folder and compares, so
CI catches a stale labs/ or a release that still holds solution code or hidden tests.
"""
from __future__ import annotations

import filecmp
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ..catalog import Catalog, Lab
from .howto import insert_block
from .nbgrader_setup import nbgrader_api, nbgrader_config

_BLOCKS = {
    "solution": re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S),
    "hidden test": re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S),
}
_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")


class BuildError(RuntimeError):
    """nbgrader could not release a lab; the message carries nbgrader's log."""


def release_labs(labs: list[Lab], root: Path, release_dir: Path) -> None:
    """Run nbgrader generate_assignment for each lab from root/solutions into release_dir, then
    write the lab's generated "How to work" block after the title cell (howto.py)."""
    toml = root / "course" / "labs.toml"
    catalog = Catalog.load(toml if toml.exists() else None)   # for the titles of required labs
    with tempfile.TemporaryDirectory(prefix="camp-build-") as tmp:
        config = nbgrader_config(root, source="solutions", release=release_dir.resolve(),
                                 db_path=Path(tmp) / "gradebook.db")
        api = nbgrader_api(config)
        for lab in labs:
            if not lab.source_path(root).exists():
                raise BuildError(f"{lab.id}: source notebook {lab.source_path(root)} does not exist")
            result = api.generate_assignment(lab.name, force=True, create=True)
            if not result["success"]:
                raise BuildError(f"{lab.id}: nbgrader generate_assignment failed:\n"
                                 f"{result.get('error') or ''}{result.get('log') or ''}")
            insert_block(release_dir / lab.name / lab.notebook, lab, catalog, lab.source_path(root))


@dataclass
class Problem:
    lab: str
    message: str

    def __str__(self) -> str:
        return f"{self.lab}: {self.message}"


def leaks(source: Path, released: Path) -> list[str]:
    """Solution code or hidden tests of `source` that survive in `released` (notebooks)."""
    src = nbformat.read(source, as_version=4)
    rel_text = "\n".join(c.source for c in nbformat.read(released, as_version=4).cells)
    found = [f"marker '{m}' present" for m in _MARKERS if m in rel_text]
    for cell in src.cells:
        for kind, pattern in _BLOCKS.items():
            for block in pattern.findall(cell.source):
                body = block.strip()
                if body and body in rel_text:
                    grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "?")
                    found.append(f"{kind} of cell '{grade_id}' present")
    return found


def check_release(labs: list[Lab], root: Path) -> list[Problem]:
    """Problems with the committed labs/: stale compared with a fresh build, or leaking."""
    problems: list[Problem] = []
    with tempfile.TemporaryDirectory(prefix="camp-check-") as tmp:
        fresh = Path(tmp) / "labs"
        release_labs(labs, root, fresh)
        for lab in labs:
            committed, built = root / "labs" / lab.name, fresh / lab.name
            if not committed.exists():
                problems.append(Problem(lab.id, f"labs/{lab.name} is missing: run `camp build {lab.id}`"))
                continue
            problems += [Problem(lab.id, f"{p}: run `camp build {lab.id}`") for p in _tree_differences(built, committed)]
            for nb in sorted(committed.rglob("*.ipynb")):
                src = root / "solutions" / lab.name / nb.relative_to(committed)
                if src.exists():
                    problems += [Problem(lab.id, f"{nb.relative_to(root)}: {m}") for m in leaks(src, nb)]
    return problems


def _tree_differences(built: Path, committed: Path) -> list[str]:
    diffs = []
    built_files = {p.relative_to(built) for p in built.rglob("*") if p.is_file()}
    committed_files = {p.relative_to(committed) for p in committed.rglob("*")
                       if p.is_file() and ".ipynb_checkpoints" not in p.parts}
    for rel in sorted(built_files - committed_files):
        diffs.append(f"labs/{committed.name}/{rel} is missing")
    for rel in sorted(committed_files - built_files):
        diffs.append(f"labs/{committed.name}/{rel} is not produced by the build")
    for rel in sorted(built_files & committed_files):
        if not filecmp.cmp(built / rel, committed / rel, shallow=False):
            diffs.append(f"labs/{committed.name}/{rel} is stale")
    return diffs
