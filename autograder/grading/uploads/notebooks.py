"""Notebook uploads: size, encoding, JSON nesting and cell sizes checked before the JSON is
parsed, so a nesting bomb or a huge cell never reaches a parser or a renderer."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ...catalog import GradingCaps
from ...text import inert
from .files import SubmissionError, human_size, read_bounded


def check_notebook(data: bytes, caps: GradingCaps, name: str = "the notebook") -> dict:
    """The notebook's JSON, parsed only once its size, encoding, nesting and cell sizes are within
    the caps; SubmissionError (saying which) otherwise."""
    shown = inert(name, 80)
    if len(data) > caps.notebook_bytes:
        raise SubmissionError(f"{shown} is {human_size(len(data))} (cap `notebook_bytes` is {human_size(caps.notebook_bytes)})")
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
            raise SubmissionError(f"cell {i} of {shown} holds {human_size(n)} of source (cap `cell_bytes` is "
                                  f"{human_size(caps.cell_bytes)})")
    return nb


def read_notebook(path: Path, caps: GradingCaps):
    """An nbformat v4 notebook read from `path` with every cap applied first (no link followed)."""
    import nbformat

    data = read_bounded(path, caps.notebook_bytes)
    check_notebook(data, caps, path.name)
    return nbformat.reads(data.decode("utf-8"), as_version=4)
