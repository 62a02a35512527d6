"""Matplotlib's font list for the grading sandboxes, made once at setup instead of in every sandbox.

matplotlib keeps the fonts it found (a scan that reads every font file's header) in
`$MPLCONFIGDIR/fontlist-v<version>.json` and scans again wherever that file is missing. A
sandbox's MPLCONFIGDIR is /tmp/.matplotlib on its fresh tmpfs (autograder.isolation.sandbox), so
every sandbox that imports pyplot (a lab's setup cell: the student's process, each rank's, each
restart) scanned again: ~0.15 s of CPU each, a few hundred times in the test suite. `make setup`
runs this module, which makes the file under the Python environment (`CACHE`, read-only in every
sandbox like the rest of the environment) as a sandbox would: HOME is the sandbox's, and no
`fc-list` runs (a sandbox cannot start a program; matplotlib then scans the font folders
itself). sandbox_init copies it into the sandbox's MPLCONFIGDIR, owned by the student, before
any of the student's code runs. Nothing of the student's is read, and what they do to their
copy only affects their own process. Where the file is missing or made by another matplotlib
(its name carries the version), each sandbox scans as before; a font the list names but the
sandbox lacks makes matplotlib warn in the student's log and scan again.

A font installed after the list was made (a Debian package that brings fonts: `make test`
installs chromium after `make setup`) would be missing from every sandbox's list, where a
sandbox that scans finds it. So the list is used only while it is fresh: `STAMP` records a
fingerprint of the font folders matplotlib scanned (every folder under them with its mtime,
which a file added or removed changes), `cache_dir()` compares it with the folders as they are
now (~0.2 ms) and answers None when they differ, and `make test` remakes a stale list
(`--if-stale`) after its installs.

    python -m autograder.isolation.font_cache [--if-stale]   # (re)make CACHE
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CACHE = Path(sys.prefix) / "share" / "llm-camp" / "matplotlib"
STAMP = "fonts.json"             # in CACHE: the folders scanned and their fingerprint
SANDBOX_HOME = "/home/student"   # autograder.isolation.sandbox.WORK: HOME in a sandbox
# what the scan runs in a sandbox's environment: the folders findSystemFonts walks there (no fc-list)
# and matplotlib's own fonts, printed for the fingerprint
SCAN = ("import json, os, matplotlib, matplotlib.font_manager as fm; "
        "print(json.dumps([*fm.X11FontDirectories, os.path.join(matplotlib.get_data_path(), 'fonts')]))")


def fingerprint(folders: list[str]) -> str:
    """A digest of every folder under `folders` (not following links, as matplotlib's walk) with
    its mtime: adding, removing or renaming a font file changes it; a missing folder counts too."""
    h = hashlib.sha256()
    for root in folders:
        h.update(f"{root}\0".encode())
        for here, dirs, _ in os.walk(root):
            dirs.sort()
            try:
                h.update(f"{here}\0{os.stat(here).st_mtime_ns}\0".encode())
            except OSError:
                h.update(f"{here}\0gone\0".encode())
    return h.hexdigest()


def cache_dir() -> Path | None:
    """CACHE when it holds a font list made from the font folders as they are now, else None
    (then each sandbox scans the fonts itself)."""
    try:
        stamp = json.loads((CACHE / STAMP).read_text())
        fresh = stamp["fingerprint"] == fingerprint(stamp["folders"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return CACHE if fresh and any(CACHE.glob("fontlist-v*.json")) else None


def build(dest: Path = CACHE) -> Path:
    """Make matplotlib's font list as a sandbox would, in `dest` (replacing what is there)."""
    with tempfile.TemporaryDirectory(prefix="camp-mpl-") as tmp:
        empty = Path(tmp) / "no-programs"   # PATH: no fc-list, as in a sandbox
        empty.mkdir()
        config = Path(tmp) / "mpl"
        env = {"HOME": SANDBOX_HOME, "PATH": str(empty), "MPLCONFIGDIR": str(config), "MPLBACKEND": "Agg",
               "LANG": os.environ.get("LANG", "C.UTF-8")}
        folders = json.loads(subprocess.run([sys.executable, "-I", "-c", SCAN], env=env, check=True, timeout=300,
                                            capture_output=True, text=True).stdout)
        made = sorted(config.glob("fontlist-v*.json"))
        if not made:
            raise RuntimeError(f"matplotlib wrote no font list in {config}")
        staged = dest.with_name(dest.name + ".new")
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir(parents=True)
        for f in made:
            shutil.copyfile(f, staged / f.name)
            os.chmod(staged / f.name, 0o644)
        (staged / STAMP).write_text(json.dumps({"folders": folders, "fingerprint": fingerprint(folders)}))
        os.chmod(staged / STAMP, 0o644)
        os.chmod(staged, 0o755)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(staged, dest)
    return dest


if __name__ == "__main__":
    if "--if-stale" in sys.argv[1:] and cache_dir() is not None:
        print(f"matplotlib's font list for the grading sandboxes is fresh: {CACHE}")
    else:
        print(f"matplotlib's font list for the grading sandboxes: {build()}")
