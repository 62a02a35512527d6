"""Reading a class's submissions: SUBMISSIONS_DIR/<student>/<lab>/<notebook>.ipynb, or one
<student>.zip per student holding <lab>/... (optionally under a <student>/ folder).

Everything here treats the input as hostile. Each upload is copied (a folder) or unpacked (a zip)
into the grader's scratch space under the course's caps (`GradingCaps`, course/labs.toml
`[grading]`), checked while copying: names, depth, file count, bytes, zip ratio, then every
notebook's size, encoding, JSON nesting and cell sizes, all before anything parses or renders
it. Trees are walked iteratively without following links (lstat, O_NOFOLLOW), files are read
with a byte bound, and a problem becomes a `Rejected` for that student only, with a reason a
person can act on. Later steps only ever see the checked copy.
"""
from __future__ import annotations

import json
import os
import re
import stat
import unicodedata
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..catalog import GradingCaps
from ..text import inert, unsafe_char

STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_ZIP_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate",
                zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "lzma"}
_CHUNK = 2**16


class SubmissionError(ValueError):
    """A submission that cannot be read; the message says why, for the grade sheet."""


@dataclass(frozen=True)
class Submission:
    student: str
    lab: str          # folder name as submitted (a lab id or name, resolved by the caller)
    path: Path        # checked copy of the folder holding the notebook(s)


@dataclass(frozen=True)
class Rejected:
    student: str      # made inert when the id itself is invalid
    reason: str
    lab: str = ""     # the lab folder the problem is in, "" when it concerns the whole upload
    valid_id: bool = True


def _ignored(name: str) -> bool:
    """Hidden files and macOS archive leftovers: never copied, never opened."""
    return name.startswith(".") or name == "__MACOSX"


class _Budget:
    """What one upload may still hold: entries and bytes, counted while copying."""

    def __init__(self, caps: GradingCaps | None):
        self.caps, self.entries, self.bytes = caps, 0, 0

    def entry(self) -> None:
        self.entries += 1
        if self.caps and self.entries > self.caps.files:
            raise SubmissionError(f"holds more than {self.caps.files} files and folders (cap `files`)")

    def file_limit(self, name: str) -> int | None:
        """Most bytes the next file may have (None: unbounded, for trusted course files)."""
        if not self.caps:
            return None
        left = self.caps.total_bytes - self.bytes
        return min(left, self.caps.notebook_bytes) if name.endswith(".ipynb") else left

    def add(self, n: int, name: str, limit: int | None) -> None:
        if limit is not None and n > limit:
            cap = ("cap `notebook_bytes`" if name.endswith(".ipynb") and limit == self.caps.notebook_bytes
                   else "cap `total_bytes` for the whole upload")
            raise SubmissionError(f"{inert(name, 80)!r} is larger than {_size(limit)} ({cap})")
        self.bytes += n


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"


def check_name(name: str, caps: GradingCaps | None) -> str:
    """Check one path component (SubmissionError saying what is wrong with it) and return the key
    two names collide under (Unicode NFC and case folded: the same file on macOS/Windows)."""
    shown = inert(name, 80)
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:
        raise SubmissionError(f"holds a file name that is not valid UTF-8 ({shown!r})") from None
    if caps and len(raw) > caps.name_bytes:
        raise SubmissionError(f"holds a file name of {len(raw)} bytes (cap `name_bytes` is {caps.name_bytes}): {shown!r}")
    if name in ("", ".", ".."):
        raise SubmissionError(f"holds a path with an empty, '.' or '..' part ({shown!r}): it points outside the submission")
    if "\\" in name or ":" in name or "/" in name:
        raise SubmissionError(f"holds a name with a backslash, colon or drive letter ({shown!r})")
    if any(unsafe_char(c) for c in name):
        raise SubmissionError(f"holds a name with control or invisible characters ({shown!r})")
    return unicodedata.normalize("NFC", name).casefold()


# ---------------------------------------------------------------------------------- folders

def _read_bounded(path: Path | str, limit: int | None, dir_fd: int | None = None) -> bytes:
    """The bytes of a regular file, never following a link and never reading more than limit+1
    bytes (a sparse or growing file cannot make it read more); SubmissionError if over `limit`."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        raise SubmissionError(f"cannot open {inert(os.path.basename(path), 80)!r} as a plain file ({exc.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SubmissionError(f"{inert(os.path.basename(path), 80)!r} is not a plain file")
        chunks, total = [], 0
        while True:
            want = _CHUNK if limit is None else min(_CHUNK, limit + 1 - total)
            if want <= 0:
                break
            chunk = os.read(fd, want)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if limit is not None and len(data) > limit:
        raise SubmissionError(f"{inert(os.path.basename(path), 80)!r} is larger than {_size(limit)}")
    return data


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _copy_tree(src: Path, dest: Path, caps: GradingCaps | None, strict: bool, merge: bool = False) -> None:
    """Copy the plain files and folders of `src` into the new folder `dest`, iteratively.

    With `caps` (an upload): names, depth, entries and bytes are checked as they are met, and
    (`strict`) a link, FIFO, device or socket is an error. Without (trusted course files) they
    are skipped. Hidden entries are skipped either way. `merge` copies over an existing `dest`."""
    budget = _Budget(caps)
    dest.mkdir(parents=True, exist_ok=merge)
    stack = [(src, dest, 0)]
    while stack:
        here, there, depth = stack.pop()
        keys: set[str] = set()
        with os.scandir(here) as it:
            for entry in it:
                name = entry.name
                if _ignored(name):
                    continue
                rel = (there / name).relative_to(dest)
                budget.entry()
                if caps:
                    key = check_name(name, caps)
                    if key in keys:
                        raise SubmissionError(f"holds two names that are the same file on macOS/Windows: {inert(rel, 120)!r}")
                    keys.add(key)
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    if caps and depth + 1 > caps.path_depth:
                        raise SubmissionError(f"has folders nested deeper than {caps.path_depth} levels (cap `path_depth`)")
                    (there / name).mkdir(exist_ok=merge)
                    stack.append((Path(entry.path), there / name, depth + 1))
                elif stat.S_ISREG(st.st_mode):
                    limit = budget.file_limit(name)
                    budget.add(st.st_size, str(rel), limit)      # apparent size: a sparse file counts whole
                    data = _read_bounded(entry.path, limit)
                    budget.bytes += len(data) - st.st_size
                    if merge and (there / name).is_file():
                        (there / name).unlink()
                    _write_new(there / name, data)
                elif strict:
                    kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a FIFO, device or socket"
                    raise SubmissionError(f"holds {kind} ({inert(rel, 120)!r}): submissions hold plain files and folders only")


def copy_plain_files(src: Path, dest: Path, replace: bool = True) -> None:
    """Copy the regular files of trusted `src` into `dest` (iteratively), skipping links, devices
    and hidden entries; `replace` empties `dest` first."""
    if replace:
        remove_tree(dest)
    _copy_tree(src, dest, None, strict=False, merge=True)


def remove_tree(path: Path) -> None:
    """Delete `path` and everything below it without recursion and without following links,
    whatever its depth (directory fds and relative names: no path grows past PATH_MAX)."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, dir_flags)
    names: list[str] = []
    try:
        while True:
            child = None
            with os.scandir(fd) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        child = entry.name
                        break
                    os.unlink(entry.name, dir_fd=fd)
            if child is not None:
                try:
                    os.chmod(child, 0o700, dir_fd=fd, follow_symlinks=False)
                except (OSError, NotImplementedError):
                    pass
                new = os.open(child, dir_flags, dir_fd=fd)
                os.close(fd)
                fd = new
                names.append(child)
                continue
            if not names:
                break
            parent = os.open("..", dir_flags, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir(names.pop(), dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path)


# ---------------------------------------------------------------------------------- zips

def _zip_parts(info: zipfile.ZipInfo, caps: GradingCaps) -> tuple[list[str], list[str]]:
    """The checked path components of a zip member and their collision keys."""
    name = info.filename
    shown = inert(name, 120)
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        raise SubmissionError(f"zip entry {shown!r} is an absolute path: it points outside the submission")
    if "\\" in name:
        raise SubmissionError(f"zip entry {shown!r} uses backslashes (made on Windows with an old tool?)")
    parts = name.rstrip("/").split("/")
    if ".." in parts:
        raise SubmissionError(f"zip entry {shown!r} points outside the submission ('..')")
    folders = len(parts) if info.is_dir() else len(parts) - 1
    if folders > caps.path_depth:
        raise SubmissionError(f"zip has folders nested deeper than {caps.path_depth} levels (cap `path_depth`)")
    try:
        keys = [check_name(p, caps) for p in parts]
    except SubmissionError as exc:
        raise SubmissionError(f"zip entry {shown!r}: {exc}") from None
    return parts, keys


def _check_directory_size(archive: Path, caps: GradingCaps) -> None:
    """Refuse a zip whose central directory alone is too big to be `caps.files` honest entries,
    before zipfile builds one object per entry (millions of tiny entries cost memory and time)."""
    try:
        with open(archive, "rb") as fp:
            end = zipfile._EndRecData(fp)   # the end-of-directory record: counts and sizes only
    except (OSError, ValueError, AttributeError):
        return   # zipfile itself reports what is wrong below
    if not end:
        return
    entries, size = end[zipfile._ECD_ENTRIES_TOTAL], end[zipfile._ECD_SIZE]
    most = caps.files * (46 + caps.name_bytes * (caps.path_depth + 1) + caps.path_depth + 1024)
    if entries > caps.files or size > most:
        raise SubmissionError(f"zip holds {entries} entries in a {_size(size)} directory (cap `files` is {caps.files})")


def _unzip(archive: Path, dest: Path, caps: GradingCaps) -> None:
    """Check every entry of `archive` against the caps, then extract it into the new `dest`."""
    size = os.lstat(archive).st_size
    if size > caps.total_bytes:
        raise SubmissionError(f"the zip is {_size(size)} (cap `total_bytes` is {_size(caps.total_bytes)})")
    _check_directory_size(archive, caps)
    try:
        zf = zipfile.ZipFile(archive)
    except UnicodeDecodeError:
        raise SubmissionError("zip holds a file name that is not valid UTF-8 though it says it is") from None
    except Exception as exc:  # BadZipFile, OSError, struct/overflow errors on forged headers...
        raise SubmissionError(f"is not a readable zip file ({type(exc).__name__}: {inert(exc, 120)})") from None
    with zf:
        members = zf.infolist()
        if len(members) > caps.files:
            raise SubmissionError(f"zip holds {len(members)} entries (cap `files` is {caps.files})")
        files: dict[tuple, str] = {}
        folders: set[tuple] = set()
        plan = []
        declared = 0
        for m in members:
            parts, keys = _zip_parts(m, caps)
            shown = inert(m.filename, 120)
            kind = stat.S_IFMT(m.external_attr >> 16)
            if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
                what = "a symbolic link" if kind == stat.S_IFLNK else "a special file"
                raise SubmissionError(f"zip entry {shown!r} is {what}: submissions hold plain files and folders only")
            if m.flag_bits & 0x1:
                raise SubmissionError(f"zip entry {shown!r} is encrypted (password-protected): zip it without a password")
            if m.compress_type not in _ZIP_METHODS:
                raise SubmissionError(f"zip entry {shown!r} uses compression method {m.compress_type}, which is not "
                                      f"supported (use {', '.join(_ZIP_METHODS.values())})")
            if m.file_size > 2**16 and m.file_size > caps.zip_ratio * max(m.compress_size, 1):
                raise SubmissionError(f"zip entry {shown!r} unpacks {m.file_size // max(m.compress_size, 1)} times its "
                                      f"packed size (cap `zip_ratio` is {caps.zip_ratio}): a zip bomb?")
            declared += m.file_size
            if declared > caps.total_bytes:
                raise SubmissionError(f"zip unpacks to more than {_size(caps.total_bytes)} (cap `total_bytes`)")
            if any(_ignored(p) for p in parts):
                continue
            for i in range(1, len(keys) + (1 if m.is_dir() else 0)):
                if tuple(keys[:i]) in files:
                    raise SubmissionError(f"zip holds {inert('/'.join(parts[:i]), 120)!r} both as a file and as a folder")
                folders.add(tuple(keys[:i]))
            if not m.is_dir():
                key = tuple(keys)
                if key in folders:
                    raise SubmissionError(f"zip holds {shown!r} both as a file and as a folder")
                if key in files:
                    raise SubmissionError(f"zip holds two entries that name the same file ({inert(files[key], 120)!r} "
                                          f"and {shown!r}, after Unicode normalisation and case folding)")
                files[key] = m.filename
                plan.append((m, parts))
        dest.mkdir(parents=True)
        budget = _Budget(caps)
        for m, parts in plan:
            target = dest.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            limit = min(m.file_size, budget.file_limit(parts[-1]))
            data = _read_member(zf, m, limit)
            budget.add(len(data), m.filename, budget.file_limit(parts[-1]))
            _write_new(target, data)
        for m in members:  # empty folders the zip declares
            if m.is_dir() and not any(_ignored(p) for p in m.filename.rstrip("/").split("/")):
                dest.joinpath(*m.filename.rstrip("/").split("/")).mkdir(parents=True, exist_ok=True)


def _read_member(zf: zipfile.ZipFile, m: zipfile.ZipInfo, limit: int) -> bytes:
    """A member's bytes, reading at most `limit`+1 of them; corrupt data is the student's error."""
    shown = inert(m.filename, 120)
    try:
        with zf.open(m) as src:
            chunks, total = [], 0
            while total <= limit:
                chunk = src.read(min(_CHUNK, limit + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
    except zipfile.BadZipFile as exc:
        reason = "fails its CRC check" if "CRC" in str(exc) else f"is damaged ({inert(exc, 100)})"
        raise SubmissionError(f"zip entry {shown!r} {reason}: the zip is corrupt") from None
    except Exception as exc:  # zlib.error, EOFError, NotImplementedError, RuntimeError (encrypted)...
        raise SubmissionError(f"zip entry {shown!r} cannot be unpacked ({type(exc).__name__}: {inert(exc, 100)})") from None
    if total > limit:
        raise SubmissionError(f"zip entry {shown!r} unpacks to more than {_size(limit)} "
                              "(more than it declares, or over cap `notebook_bytes`/`total_bytes`)")
    return b"".join(chunks)


# ---------------------------------------------------------------------------------- notebooks

def check_notebook(data: bytes, caps: GradingCaps, name: str = "the notebook") -> dict:
    """The notebook's JSON, parsed only once its size, encoding, nesting and cell sizes are within
    the caps; SubmissionError (saying which) otherwise."""
    shown = inert(name, 80)
    if len(data) > caps.notebook_bytes:
        raise SubmissionError(f"{shown} is {_size(len(data))} (cap `notebook_bytes` is {_size(caps.notebook_bytes)})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SubmissionError(f"not a valid notebook: {shown} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}): "
                              "is it really a notebook?") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    structure = re.sub(r'"[^"\\]*(?:\\.[^"\\]*)*"', "", text)   # strings cannot nest
    if '"' in structure:
        raise SubmissionError(f"not a valid notebook: {shown} is not valid JSON (a string is never closed)")
    codes = np.frombuffer(structure.encode("utf-8", "replace"), dtype=np.uint8)
    steps = (codes == ord("[")).astype(np.int32) + (codes == ord("{")) - (codes == ord("]")) - (codes == ord("}"))
    if steps.size and int(np.cumsum(steps).max()) > caps.json_depth:
        raise SubmissionError(f"not a valid notebook: {shown} nests lists/objects deeper than {caps.json_depth} levels (cap `json_depth`)")
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SubmissionError(f"not a valid notebook: {shown} is not valid JSON ({exc.msg} at line {exc.lineno} "
                              f"column {exc.colno})") from None
    except (RecursionError, ValueError) as exc:
        raise SubmissionError(f"not a valid notebook: {shown} cannot be parsed ({type(exc).__name__})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise SubmissionError(f"not a valid notebook: {shown} has no list of cells")
    for i, cell in enumerate(nb["cells"]):
        source = cell.get("source", "") if isinstance(cell, dict) else None
        if isinstance(source, list) and all(isinstance(s, str) for s in source):
            source = "".join(source)
        if not isinstance(source, str):
            raise SubmissionError(f"not a valid notebook: cell {i} of {shown} has no text source")
        n = len(source.encode("utf-8", "surrogatepass"))
        if n > caps.cell_bytes:
            raise SubmissionError(f"cell {i} of {shown} holds {_size(n)} of source (cap `cell_bytes` is "
                                  f"{_size(caps.cell_bytes)})")
    return nb


def read_notebook(path: Path, caps: GradingCaps):
    """An nbformat v4 notebook read from `path` with every cap applied first (no link followed)."""
    import nbformat

    data = _read_bounded(path, caps.notebook_bytes)
    check_notebook(data, caps, path.name)
    return nbformat.reads(data.decode("utf-8"), as_version=4)


# ---------------------------------------------------------------------------------- a class

def collect(submissions_dir: Path, scratch: Path,
            caps: GradingCaps = GradingCaps()) -> tuple[list[Submission], list[Rejected]]:
    """All (student, lab) submissions under `submissions_dir`, each checked and copied (folders)
    or unpacked (zips) into `scratch`/<student>; every problem is one student's `Rejected`."""
    found: list[Submission] = []
    rejected: list[Rejected] = []
    seen: set[str] = set()
    scratch.mkdir(parents=True, exist_ok=True)
    with os.scandir(submissions_dir) as it:
        entries = sorted(it, key=lambda e: os.fsencode(e.name))
    for entry in entries:
        if _ignored(entry.name):
            continue
        student = entry.name[:-4] if entry.name.endswith(".zip") else entry.name
        if not STUDENT_ID.match(student):
            rejected.append(Rejected(inert(entry.name, 80), f"{inert(entry.name, 80)!r} is not a valid student id "
                                     "(1-64 letters, digits, _ . @ -)", valid_id=False))
            continue
        if student in seen:
            rejected.append(Rejected(student, f"submitted twice ({inert(entry.name)} and another folder or .zip): "
                                     "only the first was graded"))
            continue
        seen.add(student)
        stage = scratch / student
        try:
            remove_tree(stage)
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise SubmissionError("is a symbolic link: submissions must be plain folders or .zip files")
            if stat.S_ISDIR(st.st_mode):
                _copy_tree(Path(entry.path), stage, caps, strict=True)
                root = stage
            elif stat.S_ISREG(st.st_mode) and entry.name.endswith(".zip"):
                _unzip(Path(entry.path), stage, caps)
                inner = [d for d in stage.iterdir()]
                root = inner[0] if len(inner) == 1 and inner[0].is_dir() and inner[0].name == student else stage
            else:
                raise SubmissionError("is neither a folder nor a .zip file")
        except SubmissionError as exc:
            rejected.append(Rejected(student, str(exc)))
            remove_tree(stage)
            continue
        except OSError as exc:  # unreadable entry, disk full...: this student only
            rejected.append(Rejected(student, f"cannot be read ({type(exc).__name__}: {inert(exc.strerror or exc, 120)})"))
            remove_tree(stage)
            continue
        labs = sorted(d for d in root.iterdir() if d.is_dir())
        if not labs:
            rejected.append(Rejected(student, "holds no lab folder (expected <student>/<lab>/<notebook>.ipynb)"))
        for lab in labs:
            problem = _lab_problem(lab, caps)
            if problem:
                rejected.append(Rejected(student, problem, lab=lab.name))
            else:
                found.append(Submission(student, lab.name, lab))
    return found, rejected


def _lab_problem(folder: Path, caps: GradingCaps) -> str:
    """Why the lab folder cannot be graded ("" if it can): no notebook, or a notebook over a cap."""
    notebooks = sorted(p for p in folder.iterdir() if p.name.endswith(".ipynb") and p.is_file())
    if not notebooks:
        return f"lab folder {inert(folder.name, 80)!r} holds no notebook (.ipynb)"
    for nb in notebooks:
        try:
            check_notebook(_read_bounded(nb, caps.notebook_bytes), caps, nb.name)
        except SubmissionError as exc:
            return str(exc)
    return ""
