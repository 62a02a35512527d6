"""A one-node Slurm for the tests (course/slurm/start.sh): started when we are root and Debian's
slurm-wlm and munge are installed (`make slurm` installs them, `make test` runs it); otherwise
a loud skip with the reason, and a failure under CI=true where they could be installed."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from autograder.catalog import repo_root
from tests.support import not_run

START = repo_root() / "course" / "slurm" / "start.sh"
DAEMONS = ("slurmctld", "slurmd", "munged")


def _missing() -> list[str]:
    return [d for d in DAEMONS if not (shutil.which(d) or Path("/usr/sbin", d).exists())]


def start_slurm() -> str:
    """SLURM_CONF of a running one-node Slurm, or a skip (a failure under CI) saying why not."""
    installable = os.geteuid() == 0 and shutil.which("apt-get") is not None
    why = None
    if os.geteuid() != 0:
        why = "starting a one-node Slurm needs root (slurmctld, slurmd and munged run as root here)"
    elif _missing():
        why = f"{', '.join(_missing())} not installed: `make slurm` installs Debian's slurm-wlm and munge"
    if why:
        not_run(f"SLURM TESTS NOT RUN: {why}", " (CI must run them where Slurm can be installed)", fail_under_ci=installable)
    p = subprocess.run([str(START)], capture_output=True, text=True, timeout=120)
    conf = next((l.split("=", 1)[1] for l in p.stdout.splitlines() if l.startswith("SLURM_CONF=")), None)
    if p.returncode != 0 or conf is None:
        pytest.fail(f"course/slurm/start.sh failed ({p.returncode}): {p.stderr.strip()[-1000:]}")
    return conf
