"""Checkpoints that survive a crash mid-write and fail loudly when they are damaged.

A run killed while writing `ckpt.pt` in place leaves a half-written file *and* no good one.
So we write to a temporary file in the same folder, fsync it (the bytes are on disk, not only
in the page cache) and os.replace() it over the old name: a rename within one filesystem is
atomic, so the name always points at a complete checkpoint, old or new.

Loading uses torch.load(weights_only=True) (the default since torch 2.6): unpickling can run
arbitrary code, weights_only only rebuilds tensors and plain containers. Everything we save fits
that: state_dicts, and the RNG states as tensors (torch), a tuple of ints (Python's `random`)
and a plain tuple with a list of ints (NumPy, converted by `rng_state()`; a raw ndarray would
need allow-listing numpy's pickling helpers).
"""
from __future__ import annotations

import os
import random
import re
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint", "rng_state", "set_rng_state"]

FORMAT = "camplib-checkpoint-v1"  # a marker, so a valid torch file of another kind is refused


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated, corrupt or not a camplib checkpoint."""


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write `state` to `path` atomically (temp file in the same folder, fsync, os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format": FORMAT, "state": state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)  # make the rename itself durable
    return path


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open a directory; the rename is still atomic there
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device | None = "cpu") -> dict[str, Any]:
    """The state dict saved by save_checkpoint; CheckpointError naming the file and the problem
    if it is missing, truncated, corrupt (zip CRCs are checked: about as fast as the load
    itself), holds objects weights_only refuses, or is not a camplib checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path}: no such file")
    size = path.stat().st_size
    if not zipfile.is_zipfile(path):  # torch.save writes a zip; its directory is at the very end
        raise CheckpointError(f"checkpoint {path} ({size} bytes) is truncated or corrupt: not a "
                              f"complete zip archive as torch.save writes (an interrupted copy or write?)")
    with zipfile.ZipFile(path) as archive:  # torch.load does not check the CRCs; flipped bits
        damaged = archive.testzip()          # in tensor data would load silently as wrong weights
    if damaged is not None:
        raise CheckpointError(f"checkpoint {path} ({size} bytes) is corrupt: the CRC of {damaged!r} "
                              f"does not match its data")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        refused = re.search(r"Unsupported global: [^\n]*", str(exc))
        if refused:
            problem = (f"it holds objects that weights_only loading refuses ({refused.group(0).strip()}); "
                       f"save only tensors and plain Python values")
        else:
            problem = f"it is truncated or corrupt ({type(exc).__name__}: {str(exc)[:120].strip()})"
        raise CheckpointError(f"checkpoint {path} ({size} bytes) cannot be loaded: {problem}") from exc
    if not isinstance(obj, dict) or obj.get("format") != FORMAT or not isinstance(obj.get("state"), dict):
        raise CheckpointError(f"checkpoint {path}: a torch file, but not a camplib checkpoint "
                              f"(expected a dict with format={FORMAT!r})")
    return obj["state"]


def rng_state() -> dict[str, Any]:
    """Every random generator a training step may draw from, in weights_only-loadable form."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(), "numpy": (kind, keys.tolist(), pos, has_gauss, cached),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what rng_state() captured, so the next random draws repeat exactly."""
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
