"""The key-value metadata at the head of a GGUF file, read without loading the model: what a
footprint estimate needs (layer counts, widths, vocabulary size) before memory is spent.

GGUF (v2 and v3): magic `GGUF`, version u32, tensor count u64, metadata count u64, then each
metadata pair as a length-prefixed UTF-8 key, a u32 value type and the value. Arrays are kept as
their length alone (a 262k-token vocabulary is skipped over, not read).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import IO, Any

MAGIC = b"GGUF"
# value type -> struct format of a scalar
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}  # fmt: skip
_STRING = 8
_ARRAY = 9
# Largest metadata count and string believed: a corrupt header must not make us read forever.
MAX_PAIRS = 1 << 16
MAX_STRING = 1 << 26


class GgufError(ValueError):
    """The file is not a GGUF file this reader understands."""


class ArrayLength(int):
    """An array value, kept as its length."""


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata pairs of the GGUF file at `path` (arrays as `ArrayLength`)."""
    with open(path, "rb") as fh:
        if fh.read(4) != MAGIC:
            raise GgufError(f"{path} is not a GGUF file")
        version = _unpack(fh, "<I")
        if version not in (2, 3):
            raise GgufError(f"{path}: GGUF version {version} is not supported")
        _unpack(fh, "<Q")  # tensors
        count = _unpack(fh, "<Q")
        if count > MAX_PAIRS:
            raise GgufError(f"{path}: {count} metadata pairs")
        found: dict[str, Any] = {}
        for _ in range(count):
            key = _string(fh)
            found[key] = _value(fh, _unpack(fh, "<I"))
        return found


def _unpack(fh: IO[bytes], fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = fh.read(size)
    if len(data) != size:
        raise GgufError("the GGUF header ends early")
    return struct.unpack(fmt, data)[0]


def _string(fh: IO[bytes]) -> str:
    length = _unpack(fh, "<Q")
    if length > MAX_STRING:
        raise GgufError(f"a GGUF string of {length} bytes")
    data = fh.read(length)
    if len(data) != length:
        raise GgufError("the GGUF header ends early")
    return data.decode("utf-8", errors="replace")


def _value(fh: IO[bytes], kind: int) -> Any:
    if kind in _SCALARS:
        return _unpack(fh, _SCALARS[kind])
    if kind == _STRING:
        return _string(fh)
    if kind == _ARRAY:
        item = _unpack(fh, "<I")
        length = _unpack(fh, "<Q")
        if item in _SCALARS:
            fh.seek(struct.calcsize(_SCALARS[item]) * length, 1)
        elif item == _STRING:
            for _ in range(length):
                fh.seek(_unpack(fh, "<Q"), 1)
        else:
            raise GgufError(f"a GGUF array of type {item}")
        return ArrayLength(length)
    raise GgufError(f"GGUF value type {kind}")
