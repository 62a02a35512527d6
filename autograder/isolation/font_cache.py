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

    python -m autograder.isolation.font_cache   # (re)make CACHE
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CACHE = Path(sys.prefix) / "share" / "llm-camp" / "matplotlib"
SANDBOX_HOME = "/home/student"   # autograder.isolation.sandbox.WORK: HOME in a sandbox


def cache_dir() -> Path | None:
    """CACHE when it holds a font list, else None."""
    return CACHE if any(CACHE.glob("fontlist-v*.json")) else None


def build(dest: Path = CACHE) -> Path:
    """Make matplotlib's font list as a sandbox would, in `dest` (replacing what is there)."""
    with tempfile.TemporaryDirectory(prefix="camp-mpl-") as tmp:
        empty = Path(tmp) / "no-programs"   # PATH: no fc-list, as in a sandbox
        empty.mkdir()
        config = Path(tmp) / "mpl"
        env = {"HOME": SANDBOX_HOME, "PATH": str(empty), "MPLCONFIGDIR": str(config), "MPLBACKEND": "Agg",
               "LANG": os.environ.get("LANG", "C.UTF-8")}
        subprocess.run([sys.executable, "-I", "-c", "import matplotlib.font_manager"], env=env, check=True,
                       timeout=300)
        made = sorted(config.glob("fontlist-v*.json"))
        if not made:
            raise RuntimeError(f"matplotlib wrote no font list in {config}")
        staged = dest.with_name(dest.name + ".new")
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir(parents=True)
        for f in made:
            shutil.copyfile(f, staged / f.name)
            os.chmod(staged / f.name, 0o644)
        os.chmod(staged, 0o755)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(staged, dest)
    return dest


if __name__ == "__main__":
    print(f"matplotlib's font list for the grading sandboxes: {build()}")
