"""What a valid notebook is, in one place for the upload check, `camp check` and the grader: UTF-8
JSON (a byte-order mark is stripped), nbformat v4 of any minor version or v3 (what older Jupyter
saves, converted to v4 with nbformat), that nbformat validates; cell sources get `\n` line ends.
Uploads and `camp check` also apply the course's caps (size, encoding, JSON nesting and cell sizes)
before the JSON is parsed, so a nesting bomb or a huge cell never reaches a parser or a renderer."""
from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np

from ...catalog import GradingCaps
from ...text import inert
from .files import SubmissionError, human_size, read_bounded


def check_notebook(data: bytes, caps: GradingCaps, name: str = "the notebook"):
    """The notebook (parse_notebook), parsed only once its size, encoding, nesting and cell sizes
    are within the caps; SubmissionError (saying which) otherwise."""
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
    cells = _cells(_json(text, shown))
    if cells is None:
        raise SubmissionError(f"not a valid notebook: {shown} has no list of cells")
    for i, cell in enumerate(cells):
        source = (cell.get("source", cell.get("input", "")) if isinstance(cell, dict) else None)
        if isinstance(source, list) and all(isinstance(s, str) for s in source):
            source = "".join(source)
        if not isinstance(source, str):
            raise SubmissionError(f"not a valid notebook: cell {i} of {shown} has no text source")
        n = len(source.encode("utf-8", "surrogatepass"))
        if n > caps.cell_bytes:
            raise SubmissionError(f"cell {i} of {shown} holds {human_size(n)} of source (cap `cell_bytes` is "
                                  f"{human_size(caps.cell_bytes)})")
    return parse_notebook(text, name)


def _cells(nb) -> list | None:
    """The cells of a parsed v4 (`cells`) or v3 (`worksheets[].cells`) notebook, None if neither."""
    if not isinstance(nb, dict):
        return None
    if isinstance(nb.get("cells"), list):
        return nb["cells"]
    sheets = nb.get("worksheets")
    if nb.get("nbformat") == 3 and isinstance(sheets, list) and all(
            isinstance(w, dict) and isinstance(w.get("cells"), list) for w in sheets):
        return [c for w in sheets for c in w["cells"]]
    return None


def _json(text: str, shown: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SubmissionError(f"not a valid notebook: {shown} is not valid JSON ({exc.msg} at line {exc.lineno} "
                              f"column {exc.colno})") from None
    except (RecursionError, ValueError) as exc:
        raise SubmissionError(f"not a valid notebook: {shown} cannot be parsed ({type(exc).__name__})") from None


def parse_notebook(data: bytes | str, name: str = "the notebook", repairs: list[str] | None = None):
    """The one rule for a valid notebook (module docstring): an nbformat v4 NotebookNode, or
    SubmissionError("not a valid notebook: ...") saying why. No caps: the grader reads the copy
    the upload check already capped. Student-controlled metadata comes back repaired
    (repair_metadata); what was repaired is appended to `repairs`."""
    import nbformat

    shown = inert(name, 80)
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SubmissionError(f"not a valid notebook: {shown} is not UTF-8 text (byte 0x{data[exc.start]:02x} "
                                  f"at offset {exc.start}): is it really a notebook?") from None
    text = data[1:] if data.startswith("\ufeff") else data
    if _cells(_json(text, shown)) is None:
        raise SubmissionError(f"not a valid notebook: {shown} has no list of cells")
    try:
        with warnings.catch_warnings():   # nbformat's advice on ids is not the student's problem
            warnings.simplefilter("ignore")
            nb = nbformat.reads(text, as_version=4)
            nbformat.validate(nb)
    except Exception as exc:  # noqa: BLE001 - whatever nbformat objects to is the reason
        path = "/".join(str(p) for p in getattr(exc, "absolute_path", []))
        if hasattr(exc, "validator"):    # a schema error: where and which rule (its text holds random cell ids)
            why = f"{path or 'its top level'} does not follow the notebook format ({exc.validator})"
        else:
            why = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise SubmissionError(f"not a valid notebook: {shown}: {inert(why, 200)}") from None
    for cell in nb.cells:
        if isinstance(cell.get("source"), str) and "\r" in cell.source:
            cell.source = cell.source.replace("\r\n", "\n").replace("\r", "\n")
    found = repair_metadata(nb)
    if repairs is not None:
        repairs += found
    return nb


# nbgrader's cell metadata and the type each field must have; anything else is the student's
# file being malformed (a hand-edited or hostile notebook), never a reason for the grader to fail.
_NBGRADER_FIELDS = {"grade_id": str, "points": (int, float), "grade": bool, "solution": bool, "locked": bool,
                    "task": bool, "schema_version": int, "cell_type": str, "checksum": str}


def repair_metadata(nb) -> list[str]:
    """Make every student-controlled metadata field the type its readers expect (build_program,
    camp check, Formgrader publishing): a `metadata.nbgrader` that is not a mapping is dropped,
    a field of the wrong type is dropped (a `points` of True or NaN too), `tags` that are not a
    list of strings become one. Returns what was repaired, one line per cell, for the feedback."""
    notes = []
    for index, cell in enumerate(nb.cells):
        meta = cell.get("metadata")
        if not isinstance(meta, dict):
            cell["metadata"] = meta = nbformat_node({})
            notes.append(f"cell {index}: its metadata was not a mapping and was ignored")
        nbg = meta.get("nbgrader")
        if nbg is not None and not isinstance(nbg, dict):
            del meta["nbgrader"]
            notes.append(f"cell {index}: its nbgrader metadata was a {type(nbg).__name__}, not a mapping, "
                         "and was ignored")
        elif isinstance(nbg, dict):
            bad = [k for k, kind in _NBGRADER_FIELDS.items() if k in nbg and not _typed(nbg[k], kind)]
            for key in bad:
                del nbg[key]
            if bad:
                notes.append(f"cell {index}: nbgrader metadata {', '.join(bad)} of the wrong type was ignored")
        tags = meta.get("tags")
        if tags is not None and not (isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
            meta["tags"] = [t for t in tags if isinstance(t, str)] if isinstance(tags, list) else []
            notes.append(f"cell {index}: its tags were not a list of strings and were repaired")
    return notes


def _typed(value, kind) -> bool:
    if isinstance(value, bool) and kind is not bool:
        return False
    if kind == (int, float):
        return isinstance(value, (int, float)) and value == value and abs(value) != float("inf")
    return isinstance(value, kind)


def nbformat_node(d: dict):
    from nbformat import from_dict
    return from_dict(d)


def read_notebook(path: Path, caps: GradingCaps):
    """An nbformat v4 notebook read from `path` with every cap applied first (no link followed)."""
    return check_notebook(read_bounded(path, caps.notebook_bytes), caps, path.name)
