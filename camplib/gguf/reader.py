"""Reading a .gguf file (llama.cpp's format: one file with the metadata, the tokenizer and the
tensors), from scratch. The layout, all little-endian (GGUF v2/v3):

    "GGUF" | u32 version | u64 tensor count | u64 metadata count
    metadata: key (u64 length + UTF-8) | u32 value type | value         (arrays: u32 type, u64 n, values)
    tensor infos: name | u32 n_dims | u64 dims (fastest first) | u32 ggml type | u64 offset
    padding to `general.alignment` (32), then the tensor data, each at its offset

Dims run fastest-first (ggml's ne[0] is a row's length), so a tensor's torch shape is the dims
reversed. The `gguf` package's GGUFReader is the reference: the same metadata and bytes
(tests/camplib/gguf); it builds a numpy view per array element, which makes SmolLM2's 98k
tokenizer strings take ~17 s there and ~0.1 s here.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from camplib.quant.ggml_blocks import BLOCK, BLOCK_BYTES, dequantize_blocks

__all__ = ["GGUFFile", "TensorInfo", "read_gguf", "GGML_TYPES"]

# metadata value type id -> little-endian format of a number (struct's and numpy's alike);
# 8 is a string, 9 an array
_NUMBERS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# ggml tensor type id -> name; the plain float types and the block formats camplib dequantizes
GGML_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 8: "Q8_0", 30: "BF16"}
_FLOAT = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
MAX_DIMS = 4


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]      # torch order (dims reversed)
    kind: str                   # "F32", "Q4_1", ...
    offset: int                 # from the start of the file
    nbytes: int


class _Cursor:
    def __init__(self, buf, path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise ValueError(f"{self.path}: truncated or corrupt GGUF (wants {n} bytes at offset {self.pos}, "
                             f"the file has {len(self.buf)})")
        view = self.buf[self.pos:self.pos + n]
        self.pos += n
        return view

    def scalar(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return bytes(self.take(self.scalar("<Q"))).decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype in _NUMBERS:
            return self.scalar(_NUMBERS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, n = self.scalar("<I"), self.scalar("<Q")
            if etype in _NUMBERS:
                dtype = np.dtype(_NUMBERS[etype])
                return np.frombuffer(self.take(n * dtype.itemsize), dtype=dtype).tolist()
            if n > len(self.buf):
                raise ValueError(f"{self.path}: an array of {n} elements at offset {self.pos} is larger than the file")
            return [self.value(etype) for _ in range(n)]
        raise ValueError(f"{self.path}: unknown metadata value type {vtype} at offset {self.pos}")


class GGUFFile:
    """metadata: {key: value}; tensors: {name: TensorInfo}; tensor(name) -> float32 torch tensor;
    raw(name) -> its bytes as a uint8 tensor (no copy: a view of the memory-mapped file)."""

    def __init__(self, path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            if f.seek(0, 2) < 24:
                raise ValueError(f"{self.path}: {f.tell()} bytes is too short for a GGUF header (24)")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)   # writable view: torch.frombuffer wants one; pages are only copied if written
        cur = _Cursor(memoryview(self._map), self.path)
        magic = bytes(cur.take(4))
        if magic != b"GGUF":
            raise ValueError(f"{self.path}: not a GGUF file (starts with {magic!r})")
        self.version = cur.scalar("<I")
        if self.version not in (2, 3):
            raise ValueError(f"{self.path}: GGUF version {self.version} is not supported (2 and 3 are)")
        n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
        self.metadata = {}
        for _ in range(n_kv):
            key = cur.string()
            self.metadata[key] = cur.value(cur.scalar("<I"))
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.scalar("<I")
            if n_dims > MAX_DIMS:
                raise ValueError(f"{self.path}: tensor {name!r} has {n_dims} dims (at most {MAX_DIMS})")
            dims = [cur.scalar("<Q") for _ in range(n_dims)]
            infos.append((name, dims, cur.scalar("<I"), cur.scalar("<Q")))
        align = int(self.metadata.get("general.alignment", 32))
        data_start = -(-cur.pos // align) * align
        self.tensors = {}
        for name, dims, type_id, offset in infos:
            kind = GGML_TYPES.get(type_id, f"type {type_id}")
            count = int(np.prod(dims)) if dims else 1
            if kind in _FLOAT:
                nbytes = count * _FLOAT[kind].itemsize
            elif kind in BLOCK_BYTES:
                nbytes = count // BLOCK * BLOCK_BYTES[kind]
            else:
                nbytes = 0     # unsupported: listed, and tensor() says so
            start = data_start + offset
            if start + nbytes > len(self._map):
                raise ValueError(f"{self.path}: tensor {name!r} runs past the end of the file")
            self.tensors[name] = TensorInfo(name, tuple(reversed(dims)), kind, start, nbytes)

    def raw(self, name: str) -> torch.Tensor:
        t = self.tensors[name]
        return torch.frombuffer(self._map, dtype=torch.uint8, count=t.nbytes, offset=t.offset)

    def tensor(self, name: str) -> torch.Tensor:
        t = self.tensors[name]
        if t.kind in _FLOAT:
            return self.raw(name).view(_FLOAT[t.kind]).reshape(t.shape).to(torch.float32)
        if t.kind in BLOCK_BYTES:
            rows = self.raw(name).reshape(-1, t.shape[-1] // BLOCK * BLOCK_BYTES[t.kind])
            return dequantize_blocks(rows, t.kind).reshape(t.shape)
        raise NotImplementedError(f"{self.path}: tensor {name!r} is {t.kind}; camplib reads "
                                  f"{sorted(_FLOAT) + sorted(BLOCK_BYTES)}")


def read_gguf(path) -> GGUFFile:
    return GGUFFile(path)
