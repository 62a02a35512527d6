"""The lab catalog (course/labs.toml) as Python objects: the one place `camp` learns what the
course contains, where each lab's notebooks live and how to run them."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI (pyproject: tomli; python_version < "3.11")
    import tomli as tomllib

LEVELS = ("basic", "advanced", "project")
STATUSES = ("ready", "planned")
PROFILES = ("ci", "gpu")


def repo_root() -> Path:
    """The course repository: $CAMP_ROOT, else this package's parent (editable install), else
    the nearest folder above the current directory that holds course/labs.toml."""
    if os.environ.get("CAMP_ROOT"):
        return Path(os.environ["CAMP_ROOT"]).resolve()
    here = Path(__file__).resolve().parent.parent
    for candidate in (here, *Path.cwd().resolve().parents, Path.cwd().resolve()):
        if (candidate / "course" / "labs.toml").exists():
            return candidate
    return here


@dataclass(frozen=True)
class Lab:
    id: str
    name: str
    level: str
    title: str
    status: str
    requires: tuple[str, ...] = ()
    minutes: int = 0
    forbid: tuple[str, ...] = ()
    profiles: dict[str, dict] = field(default_factory=dict)
    cell_timeout: int = 120
    background: str = ""     # what a student should know besides the required labs (How to work block)
    notes: str = ""          # lab-specific advice for the How to work block (what IS allowed, say)

    @property
    def notebook(self) -> str:
        """File name of the lab's notebook inside its folder."""
        return f"{self.name}.ipynb"

    def source_path(self, root: Path) -> Path:
        return root / "solutions" / self.name / self.notebook

    def release_path(self, root: Path) -> Path:
        return root / "labs" / self.name / self.notebook

    def parameters(self, profile: str) -> dict:
        if profile not in self.profiles:
            raise KeyError(f"lab {self.id} has no profile {profile!r} (has: {', '.join(self.profiles) or 'none'})")
        return dict(self.profiles[profile])


class CatalogError(ValueError):
    """course/labs.toml is inconsistent (unknown level, duplicate id, missing profile...)."""


@dataclass(frozen=True)
class GradingCaps:
    """Bounds on what a submission may hold (course/labs.toml `[grading]`): checked while reading an
    upload, before anything scans, parses or renders it, so an absurd upload costs bounded time,
    memory and disk and ends as that student's error."""
    notebook_bytes: int = 20 * 2**20   # one .ipynb file
    cell_bytes: int = 2**20            # one cell's source
    files: int = 500                   # files and folders in one student's upload
    total_bytes: int = 100 * 2**20     # all files of one upload (a zip: unpacked and packed)
    path_depth: int = 12               # folders above a file inside the upload
    name_bytes: int = 128              # one file or folder name, UTF-8
    zip_ratio: int = 100               # unpacked / packed bytes of one zip member
    json_depth: int = 64               # nesting of lists and objects in a notebook

    @classmethod
    def from_dict(cls, d: dict) -> "GradingCaps":
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise CatalogError(f"[grading] has unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        for key, value in d.items():
            if type(value) is not int or value < 1:
                raise CatalogError(f"[grading] {key} must be a positive integer, not {value!r}")
        caps = cls(**d)
        if caps.cell_bytes > caps.notebook_bytes or caps.notebook_bytes > caps.total_bytes:
            raise CatalogError("[grading] needs cell_bytes <= notebook_bytes <= total_bytes")
        return caps


@dataclass(frozen=True)
class Catalog:
    labs: tuple[Lab, ...]
    caps: GradingCaps = field(default_factory=GradingCaps)

    @classmethod
    def load(cls, path: Path | None = None) -> "Catalog":
        path = path or repo_root() / "course" / "labs.toml"
        with open(path, "rb") as f:
            raw = tomllib.load(f)
        labs = tuple(_lab_from_dict(d) for d in raw.get("lab", []))
        grading = raw.get("grading", {})
        if not isinstance(grading, dict):
            raise CatalogError("course/labs.toml: [grading] must be a table")
        catalog = cls(labs, GradingCaps.from_dict(grading))
        catalog.validate()
        return catalog

    def validate(self) -> None:
        ids = [lab.id for lab in self.labs]
        names = [lab.name for lab in self.labs]
        for seen, what in ((ids, "id"), (names, "name")):
            dup = {x for x in seen if seen.count(x) > 1}
            if dup:
                raise CatalogError(f"duplicate lab {what}: {', '.join(sorted(dup))}")
        for lab in self.labs:
            if lab.level not in LEVELS:
                raise CatalogError(f"lab {lab.id}: level {lab.level!r} is not one of {LEVELS}")
            if lab.status not in STATUSES:
                raise CatalogError(f"lab {lab.id}: status {lab.status!r} is not one of {STATUSES}")
            if not lab.name.startswith(lab.id + "_"):
                raise CatalogError(f"lab {lab.id}: name {lab.name!r} must start with '{lab.id}_'")
            unknown = [r for r in lab.requires if r not in ids]
            if unknown:
                raise CatalogError(f"lab {lab.id}: requires unknown lab(s) {', '.join(unknown)}")
            if lab.status == "ready" and set(lab.profiles) != set(PROFILES):
                raise CatalogError(f"lab {lab.id}: a ready lab needs exactly the profiles {PROFILES}, "
                                   f"has {tuple(lab.profiles)}")

    def get(self, key: str) -> Lab:
        """A lab by id (b01) or name (b01_attention)."""
        for lab in self.labs:
            if key in (lab.id, lab.name):
                return lab
        raise KeyError(f"no lab {key!r} in the catalog (known: {', '.join(l.id for l in self.labs)})")

    def ready(self) -> list[Lab]:
        return [lab for lab in self.labs if lab.status == "ready"]

    def select(self, keys: list[str] | None) -> list[Lab]:
        """The labs named by `keys`, or every ready lab when none are named."""
        return [self.get(k) for k in keys] if keys else self.ready()


def _lab_from_dict(d: dict) -> Lab:
    try:
        return Lab(
            id=d["id"], name=d["name"], level=d["level"], title=d["title"], status=d["status"],
            requires=tuple(d.get("requires", ())), minutes=int(d.get("minutes", 0)),
            forbid=tuple(d.get("forbid", ())), profiles=dict(d.get("profiles", {})),
            cell_timeout=int(d.get("cell_timeout", 120)),
            background=str(d.get("background", "")), notes=str(d.get("notes", "")),
        )
    except KeyError as exc:
        raise CatalogError(f"a lab in course/labs.toml lacks the field {exc}: {d}") from None
