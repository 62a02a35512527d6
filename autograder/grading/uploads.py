"""Reading a class's submissions: SUBMISSIONS_DIR/<student>/<lab>/<notebook>.ipynb, or one
<student>.zip per student holding <lab>/... (optionally under a <student>/ folder).

Everything here treats the input as hostile: student ids are checked, zip members cannot escape
their folder, symlinks are never followed or copied, sizes are capped. A bad entry becomes a
reported problem for that student only.
"""
from __future__ import annotations

import re
import shutil
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path

STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
MAX_ZIP_MEMBERS = 2000
MAX_ZIP_BYTES = 200 * 2**20


class SubmissionError(ValueError):
    """A submission that cannot be read; the message says why, for the grade sheet."""


@dataclass(frozen=True)
class Submission:
    student: str
    lab: str          # folder name as submitted (a lab id or name, resolved by the caller)
    path: Path        # folder holding the notebook(s)


@dataclass(frozen=True)
class Rejected:
    student: str
    reason: str


def collect(submissions_dir: Path, scratch: Path) -> tuple[list[Submission], list[Rejected]]:
    """All (student, lab) submissions under `submissions_dir`; zips are unpacked into `scratch`."""
    found: list[Submission] = []
    rejected: list[Rejected] = []
    seen: set[str] = set()
    for entry in sorted(submissions_dir.iterdir()):
        if entry.name.startswith("."):
            continue
        student = entry.stem if entry.suffix == ".zip" else entry.name
        try:
            if not STUDENT_ID.match(student):
                raise SubmissionError(f"{entry.name!r} is not a valid student id (letters, digits, _ . @ -)")
            if student in seen:
                raise SubmissionError("submitted twice (a folder and a .zip?): only the first was graded")
            if entry.is_symlink():
                raise SubmissionError("is a symbolic link: submissions must be plain folders or .zip files")
            if entry.is_dir():
                root = entry
            elif entry.suffix == ".zip":
                root = _unzip(entry, scratch / student)
            else:
                raise SubmissionError("is neither a folder nor a .zip file")
        except SubmissionError as exc:
            rejected.append(Rejected(student, str(exc)))
            continue
        seen.add(student)
        labs = [d for d in sorted(root.iterdir()) if d.is_dir() and not d.is_symlink() and not d.name.startswith(".")]
        if not labs:
            rejected.append(Rejected(student, "holds no lab folder (expected <student>/<lab>/<notebook>.ipynb)"))
        found += [Submission(student, d.name, d) for d in labs]
    return found, rejected


def copy_plain_files(src: Path, dest: Path, replace: bool = True) -> None:
    """Copy the regular files of `src` into `dest` (recursively), skipping links and devices;
    `replace` empties `dest` first."""
    if replace and dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if any(p.startswith(".") for p in rel.parts) or path.is_symlink():
            continue
        if path.is_dir():
            (dest / rel).mkdir(parents=True, exist_ok=True)
        elif path.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest / rel)


def _unzip(archive: Path, dest: Path) -> Path:
    """Safely extract `archive` into `dest`; return the folder that holds the lab folders."""
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as exc:
        raise SubmissionError(f"is not a readable zip file ({exc})") from None
    with zf:
        members = zf.infolist()
        if len(members) > MAX_ZIP_MEMBERS:
            raise SubmissionError(f"zip holds {len(members)} entries (limit {MAX_ZIP_MEMBERS})")
        if sum(m.file_size for m in members) > MAX_ZIP_BYTES:
            raise SubmissionError(f"zip unpacks to more than {MAX_ZIP_BYTES // 2**20} MiB")
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        for m in members:
            parts = Path(m.filename).parts
            if m.filename.startswith(("/", "\\")) or ".." in parts or (parts and ":" in parts[0]):
                raise SubmissionError(f"zip entry {m.filename!r} points outside the submission")
            if stat.S_ISLNK(m.external_attr >> 16):
                continue  # never materialise links from a submission
            target = dest.joinpath(*parts)
            if m.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(m) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
    inner = [d for d in dest.iterdir() if not d.name.startswith(("_", "."))]
    if len(inner) == 1 and inner[0].is_dir() and inner[0].name == dest.name:
        return inner[0]  # zip made of the whole <student>/ folder
    return dest
