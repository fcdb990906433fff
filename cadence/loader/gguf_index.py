"""The tensors of a GGUF file and its scalar metadata, indexed without materialising the
metadata arrays.

gguf-py's GGUFReader builds numpy views for every metadata value; for SmolLM2 the
tokenizer's ~100k strings took 5 s and 158 MiB at every engine start (the config and
tokenizer are converted once, elsewhere: cadence/loader/gguf.py). Loading weights needs
only the tensor table and a few scalar keys, so this walks the header once with `struct`,
keeps scalar values, steps over arrays, and maps the file read-only. Type names and block
sizes still come from gguf-py.

Layout (GGUF v2/v3, little-endian): magic, version u32, tensor count u64, metadata count
u64; each metadata entry a string key, a value type u32 and the value (an array: item type
u32, count u64, items); each tensor a string name, n_dims u32, dims u64 (row length
first), type u32, data offset u64 from the data section, which starts at the next multiple
of `general.alignment` (default 32) after the table. A string: length u64, UTF-8 bytes.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import quant_shape_to_byte_shape

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# struct codes of the fixed-size value types (little-endian)
_SCALARS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
# tensor types whose data numpy reads as numbers; every other type is blocks of bytes
_NUMPY = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True)
class IndexedTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF order: the row length first
    data: np.ndarray  # a read-only view of the map: [..., rows, row bytes] for block types


class GgufIndex:
    """`tensors` in file order, `scalar(key)` for non-array metadata. The map stays open
    while any tensor's data is referenced."""

    def __init__(self, path: str | Path) -> None:
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._at = 0
        if self._map[:4] != MAGIC:
            raise ValueError(f"{path} is not a GGUF file (no GGUF magic)")
        self._at = 4
        version = self._read("<I")
        if version not in VERSIONS:
            raise ValueError(f"{path}: GGUF version {version} (big-endian or unsupported)")
        tensor_count, kv_count = self._read("<Q"), self._read("<Q")
        self._scalars: dict[str, object] = {}
        for _ in range(kv_count):
            key = self._string()
            kind = GGUFValueType(self._read("<I"))
            if kind == GGUFValueType.ARRAY:
                self._skip_array()
            else:
                self._scalars[key] = self._value(kind)
        table = [self._tensor_info() for _ in range(tensor_count)]
        align = int(self._scalars.get("general.alignment", DEFAULT_ALIGNMENT))
        if align <= 0 or align & (align - 1):
            raise ValueError(f"{path}: general.alignment {align} is not a power of two")
        start = -(-self._at // align) * align
        self.tensors = [self._tensor(start, *info) for info in table]

    def scalar(self, key: str) -> object | None:
        """A metadata value that is not an array (None when the file has no such key)."""
        return self._scalars.get(key)

    def drop_resident_pages(self) -> None:
        """Release the pages read so far from this process's resident memory. The data
        stays valid: a later read faults the page in again from the file."""
        if hasattr(self._map, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    # The walk over the header: each call reads at self._at and moves past what it read.
    def _read(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self._map, self._at)
        self._at += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._read("<Q")
        text = self._map[self._at : self._at + n].decode("utf-8", errors="replace")
        self._at += n
        return text

    def _value(self, kind: GGUFValueType) -> object:
        return self._string() if kind == GGUFValueType.STRING else self._read(_SCALARS[kind])

    def _skip_array(self) -> None:
        kind = GGUFValueType(self._read("<I"))
        count = self._read("<Q")
        if kind in _SCALARS:
            self._at += count * struct.calcsize(_SCALARS[kind])
        elif kind == GGUFValueType.STRING:
            for _ in range(count):  # (lengths vary: each one is read)
                self._at += 8 + struct.unpack_from("<Q", self._map, self._at)[0]
        else:  # arrays of arrays
            for _ in range(count):
                self._skip_array()

    def _tensor_info(self) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
        name = self._string()
        dims = tuple(self._read("<Q") for _ in range(self._read("<I")))
        return name, dims, GGMLQuantizationType(self._read("<I")), self._read("<Q")

    def _tensor(self, start, name, dims, kind, offset) -> IndexedTensor:
        count = int(np.prod(dims))
        rows = tuple(reversed(dims))  # numpy order: the row length last
        if kind in _NUMPY:
            data = np.frombuffer(self._map, _NUMPY[kind], count, start + offset).reshape(rows)
        else:
            block, size = GGML_QUANT_SIZES[kind]
            raw = np.frombuffer(self._map, np.uint8, count * size // block, start + offset)
            data = raw.reshape(quant_shape_to_byte_shape(rows, kind))
        return IndexedTensor(name, kind, dims, data)
