"""Zip uploads: every entry checked against the caps (names, kinds, encryption, compression
method, ratio, declared sizes, file/folder clashes) before anything is unpacked, then unpacked
with bounded reads."""
from __future__ import annotations

import os
import re
import stat
import zipfile
from pathlib import Path

from ...catalog import GradingCaps
from ...text import inert
from .files import CHUNK, Budget, SubmissionError, check_name, human_size, ignored, write_new

_ZIP_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate",
                zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "lzma"}


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
        raise SubmissionError(f"zip holds {entries} entries in a {human_size(size)} directory (cap `files` is {caps.files})")


def unzip(archive: Path, dest: Path, caps: GradingCaps) -> None:
    """Check every entry of `archive` against the caps, then extract it into the new `dest`."""
    size = os.lstat(archive).st_size
    if size > caps.total_bytes:
        raise SubmissionError(f"the zip is {human_size(size)} (cap `total_bytes` is {human_size(caps.total_bytes)})")
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
                raise SubmissionError(f"zip unpacks to more than {human_size(caps.total_bytes)} (cap `total_bytes`)")
            if any(ignored(p) for p in parts):
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
        budget = Budget(caps)
        for m, parts in plan:
            target = dest.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            limit = min(m.file_size, budget.file_limit(parts[-1]))
            data = _read_member(zf, m, limit)
            budget.add(len(data), m.filename, budget.file_limit(parts[-1]))
            write_new(target, data)
        for m in members:  # empty folders the zip declares
            if m.is_dir() and not any(ignored(p) for p in m.filename.rstrip("/").split("/")):
                dest.joinpath(*m.filename.rstrip("/").split("/")).mkdir(parents=True, exist_ok=True)


def _read_member(zf: zipfile.ZipFile, m: zipfile.ZipInfo, limit: int) -> bytes:
    """A member's bytes, reading at most `limit`+1 of them; corrupt data is the student's error."""
    shown = inert(m.filename, 120)
    try:
        with zf.open(m) as src:
            chunks, total = [], 0
            while total <= limit:
                chunk = src.read(min(CHUNK, limit + 1 - total))
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
        raise SubmissionError(f"zip entry {shown!r} unpacks to more than {human_size(limit)} "
                              "(more than it declares, or over cap `notebook_bytes`/`total_bytes`)")
    return b"".join(chunks)
