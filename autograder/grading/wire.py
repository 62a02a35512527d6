"""The only format that crosses between a student's process and the grader: a JSON header plus
one safetensors blob. Tensors and plain data (None, bool, int, float, str, lists, tuples, dicts
with string keys, dtypes) travel; nothing is ever pickled, so decoding a hostile message can
at worst fail, never run code. Objects that must stay in the student's process travel as
opaque handles.

Frame: 8-byte big-endian header length, header (UTF-8 JSON), 8-byte blob length, blob.

The student's process writes half of these frames, so a frame never sizes an allocation on the
trusted side: lengths are checked against caps before anything is read, bytes arrive in bounded
chunks (a lying length prefix costs only the bytes actually sent), and every way a header or
blob can be malformed (too deep, not JSON, bad safetensors) is a WireError, the student's
failed answer. The blob cap is what the labs' tests need (CAMP_MAX_BLOB_MB, default 256 MiB).
"""
from __future__ import annotations

import json
import math
import os
import struct
from typing import Any, BinaryIO

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

MAX_HEADER_BYTES = 16 * 2**20
MAX_BLOB_BYTES = int(os.environ.get("CAMP_MAX_BLOB_MB", "256")) * 2**20
MAX_DEPTH = 32
CHUNK_BYTES = 2**20          # most bytes asked of the stream at once


class WireError(ValueError):
    """A value that cannot be sent, or a message that is malformed or too large."""


class Handle:
    """Reference to an object living in the student's process: an object id (a module instance,
    say) or the name of something their notebook defined (a function passed to a course helper)."""

    __slots__ = ("id",)

    def __init__(self, id: int | str):
        self.id = id if isinstance(id, str) else int(id)

    def __repr__(self) -> str:
        return f"Handle({self.id})"


def encode(value: Any, register_handle=None) -> tuple[Any, dict[str, torch.Tensor]]:
    """(JSON-able structure, tensors) for `value`. Objects that are not plain data become handles
    through `register_handle(obj) -> int` when given, else raise WireError naming their type."""
    tensors: dict[str, torch.Tensor] = {}

    def enc(v, depth):
        if depth > MAX_DEPTH:
            raise WireError("value nested too deeply")
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return v if abs(v) < 2**53 else {"__int__": str(v)}
        if isinstance(v, float):
            return v if math.isfinite(v) else {"__float__": repr(v)}
        if isinstance(v, torch.Tensor):
            key = f"t{len(tensors)}"
            tensors[key] = v.detach().to("cpu").clone().contiguous()
            return {"__tensor__": key}
        if isinstance(v, torch.dtype):
            return {"__dtype__": str(v).removeprefix("torch.")}
        if isinstance(v, torch.device):
            return {"__device__": str(v)}
        if isinstance(v, Handle):
            return {"__handle__": v.id}
        if hasattr(type(v), "_as_handle"):  # a stand-in for an object already in the student's process
            return {"__handle__": v._as_handle()}
        if type(v) in (list, tuple):
            items = [enc(x, depth + 1) for x in v]
            return items if type(v) is list else {"__tuple__": items}
        if type(v) is dict:
            if not all(type(k) is str for k in v):
                raise WireError("dict keys must be strings")
            return {"__dict__": {k: enc(x, depth + 1) for k, x in v.items()}}
        if register_handle is not None:
            return {"__handle__": register_handle(v)}
        raise WireError(f"a value of type {type(v).__module__}.{type(v).__qualname__} cannot be graded "
                        "(expected tensors, numbers, strings, lists, tuples or dicts)")

    return enc(value, 0), tensors


def decode(structure: Any, tensors: dict[str, torch.Tensor], resolve_handle=None) -> Any:
    """Inverse of `encode`; handles become `Handle` objects unless `resolve_handle` maps them."""
    def dec(v, depth):
        if depth > MAX_DEPTH:
            raise WireError("value nested too deeply")
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, list):
            return [dec(x, depth + 1) for x in v]
        if not isinstance(v, dict) or len(v) != 1:
            raise WireError("malformed value")
        (tag, payload), = v.items()
        if tag == "__tensor__":
            if payload not in tensors:
                raise WireError(f"missing tensor {payload!r}")
            return tensors[payload]
        if tag == "__tuple__" and isinstance(payload, list):
            return tuple(dec(x, depth + 1) for x in payload)
        if tag == "__dict__" and isinstance(payload, dict):
            return {str(k): dec(x, depth + 1) for k, x in payload.items()}
        if tag == "__float__" and payload in ("nan", "inf", "-inf"):
            return float(payload)
        if tag == "__int__" and isinstance(payload, str) and len(payload) <= 64:
            try:
                return int(payload)
            except ValueError:
                raise WireError("malformed integer") from None
        if tag == "__dtype__" and isinstance(getattr(torch, str(payload), None), torch.dtype):
            return getattr(torch, payload)
        if tag == "__device__" and isinstance(payload, str):
            return torch.device(payload)
        if tag == "__handle__" and isinstance(payload, (int, str)) and not isinstance(payload, bool):
            return resolve_handle(payload) if resolve_handle else Handle(payload)
        raise WireError(f"malformed value tag {tag!r}")

    return dec(structure, 0)


def write_message(stream: BinaryIO, header: dict, tensors: dict[str, torch.Tensor] | None = None) -> None:
    head = json.dumps(header).encode()
    blob = st_save(tensors) if tensors else b""
    stream.write(struct.pack(">Q", len(head)) + head + struct.pack(">Q", len(blob)) + blob)
    stream.flush()


def read_message(stream: BinaryIO) -> tuple[dict, dict[str, torch.Tensor]]:
    """One frame from `stream`; raises EOFError when the peer is gone, WireError when malformed."""
    raw = _read_exact(stream, _read_length(stream, MAX_HEADER_BYTES))
    try:
        head = json.loads(raw)
    except (ValueError, RecursionError) as exc:   # not JSON, bad UTF-8, nested past the parser's depth
        raise WireError(f"malformed message header ({type(exc).__name__})") from None
    if not isinstance(head, dict):
        raise WireError("message header is not an object")
    n = _read_length(stream, MAX_BLOB_BYTES)
    blob = _read_exact(stream, n) if n else b""
    try:
        tensors = st_load(blob) if blob else {}
    except Exception as exc:
        raise WireError(f"malformed tensor blob: {str(exc)[:200]}") from None
    if not isinstance(tensors, dict) or sum(t.numel() * t.element_size() for t in tensors.values()) > MAX_BLOB_BYTES:
        raise WireError("tensor blob larger than its declared length")
    return head, tensors


def _read_length(stream: BinaryIO, limit: int) -> int:
    (n,) = struct.unpack(">Q", _read_exact(stream, 8))
    if n > limit:
        raise WireError(f"message of {n} bytes exceeds the {limit}-byte limit")
    return n


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = stream.read(min(left, CHUNK_BYTES))   # never a buffer the peer's length prefix sized
        if not chunk:
            raise EOFError("the student's process closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
