"""Files of an upload: names checked, trees copied and removed iteratively without following
links, files read with a byte bound, and the per-upload budget of entries and bytes."""
from __future__ import annotations

import os
import stat
import unicodedata
from pathlib import Path

from ...catalog import GradingCaps
from ...text import inert, unsafe_char

CHUNK = 2**16


class SubmissionError(ValueError):
    """A submission that cannot be read; the message says why, for the grade sheet."""



def ignored(name: str) -> bool:
    """Hidden files and macOS archive leftovers: never copied, never opened."""
    return name.startswith(".") or name == "__MACOSX"


class Budget:
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
            raise SubmissionError(f"{inert(name, 80)!r} is larger than {human_size(limit)} ({cap})")
        self.bytes += n


def human_size(n: int) -> str:
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

def read_bounded(path: Path | str, limit: int | None, dir_fd: int | None = None) -> bytes:
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
            want = CHUNK if limit is None else min(CHUNK, limit + 1 - total)
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
        raise SubmissionError(f"{inert(os.path.basename(path), 80)!r} is larger than {human_size(limit)}")
    return data


def write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def copy_tree(src: Path, dest: Path, caps: GradingCaps | None, strict: bool, merge: bool = False) -> None:
    """Copy the plain files and folders of `src` into the new folder `dest`, iteratively.

    With `caps` (an upload): names, depth, entries and bytes are checked as they are met, and
    (`strict`) a link, FIFO, device or socket is an error. Without (trusted course files) they
    are skipped. Hidden entries are skipped either way. `merge` copies over an existing `dest`."""
    budget = Budget(caps)
    dest.mkdir(parents=True, exist_ok=merge)
    stack = [(src, dest, 0)]
    while stack:
        here, there, depth = stack.pop()
        keys: set[str] = set()
        with os.scandir(here) as it:
            for entry in it:
                name = entry.name
                if ignored(name):
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
                    data = read_bounded(entry.path, limit)
                    budget.bytes += len(data) - st.st_size
                    if merge and (there / name).is_file():
                        (there / name).unlink()
                    write_new(there / name, data)
                elif strict:
                    kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a FIFO, device or socket"
                    raise SubmissionError(f"holds {kind} ({inert(rel, 120)!r}): submissions hold plain files and folders only")


def copy_plain_files(src: Path, dest: Path, replace: bool = True) -> None:
    """Copy the regular files of trusted `src` into `dest` (iteratively), skipping links, devices
    and hidden entries; `replace` empties `dest` first."""
    if replace:
        remove_tree(dest)
    copy_tree(src, dest, None, strict=False, merge=True)


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


def share_with_group(path: Path) -> None:
    """In a group-shared workspace (its folder setgid with a group other than root's, as `make
    hub` makes it for the class's instructors), give what root wrote under `path` that group,
    with its read and write bits (folders setgid too): after `sudo camp grade`, the instructors'
    Formgrader can still write the gradebook and their next collect replace a collected copy.
    Never follows links. Does nothing unless run as root on such a folder."""
    top = os.lstat(path)
    if os.geteuid() != 0 or not top.st_mode & stat.S_ISGID or top.st_gid == 0:
        return
    for folder, dirs, files in os.walk(path, followlinks=False):
        for name in [*dirs, *files]:
            entry = os.path.join(folder, name)
            st = os.lstat(entry)
            if st.st_uid != 0 or stat.S_ISLNK(st.st_mode):
                continue
            os.lchown(entry, -1, top.st_gid)
            extra = (stat.S_ISGID | 0o070) if stat.S_ISDIR(st.st_mode) else 0o060
            os.chmod(entry, stat.S_IMODE(st.st_mode) | extra)
