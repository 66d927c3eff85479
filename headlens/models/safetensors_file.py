"""A safetensors file's header, read and checked without trusting a byte of it.

Why it looks like this:

- **Lengths are checked before they are used.** The first 8 bytes give the header's length; read from a
  file of random bytes, that is up to 2**64, and ``f.read(n)`` with it ends in ``MemoryError``. The length
  is checked against the file's size (and the 100 MB the safetensors library allows) first.
- **Every entry is checked against the file**: a known dtype, a shape of non-negative integers, and
  ``data_offsets`` inside the data section whose span is the shape's size in that dtype. A flipped byte
  is a ``CheckpointError`` naming the file and the field, never a traceback from ``json`` or ``struct``.
- **One reader for every header read**: the memory estimate, the doctor's shapes and the checkpoint
  loader's metadata all come through :func:`read_safetensors_header`; the tensors themselves are the
  safetensors library's (which checks the same bounds in Rust).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from headlens.errors import CheckpointError

MAX_HEADER = 100_000_000  # the safetensors library's own limit on the header's length
ITEM_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F4": 4, "F6_E2M3": 6,
             "F6_E3M2": 6, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
             "I64": 64, "U64": 64, "F64": 64, "C64": 64}


def read_safetensors_header(path: str | os.PathLike) -> dict[str, Any]:
    """The header of a safetensors file (``{name: {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}``),
    every field checked against the file; a ``CheckpointError`` naming the file and the bad field otherwise.

    >>> import tempfile
    >>> bad = Path(tempfile.mkdtemp()) / "x.safetensors"
    >>> _ = bad.write_bytes(b'{"not": "safetensors"')
    >>> read_safetensors_header(bad)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    headlens.errors.CheckpointError: ...x.safetensors' is not a readable safetensors file: its header length (2,322,206,441,343,951,483 bytes) is more than the 21-byte file holds
    """
    path = Path(path)
    where = f"{str(path)!r} is not a readable safetensors file"
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{where}: it has {size} bytes, fewer than the 8 of a header length")
            n = int.from_bytes(head, "little")
            if n > size - 8 or n > MAX_HEADER:
                raise CheckpointError(f"{where}: its header length ({n:,} bytes) is more than the {size:,}-byte "
                                      f"file holds" + (f" (at most {MAX_HEADER:,})" if n <= size - 8 else ""))
            raw = f.read(n)
    except OSError as err:
        raise CheckpointError(f"cannot read {str(path)!r}: {err.strerror or err}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"{where}: its {n:,}-byte header is not JSON ({err})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{where}: its header is a JSON {type(header).__name__}, not an object")
    data = size - 8 - n
    for name, entry in header.items():
        _check_entry(path, name, entry, data)
    return header


def _check_entry(path: Path, name: str, entry: Any, data: int) -> None:
    bad = f"{str(path)!r} is a corrupt or truncated safetensors file: "
    if name == "__metadata__":
        if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
            raise CheckpointError(bad + "'__metadata__' is not a map of strings to strings")
        return
    if not isinstance(entry, dict):
        raise CheckpointError(bad + f"the entry of tensor {name!r} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in ITEM_BITS:
        raise CheckpointError(bad + f"tensor {name!r} has dtype {dtype!r}, not a safetensors dtype")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise CheckpointError(bad + f"tensor {name!r} has shape {shape!r}, not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= data):
        raise CheckpointError(bad + f"the data_offsets of tensor {name!r} are {offsets!r}, outside the "
                              f"{data:,} bytes of data")
    numel = 1
    for d in shape:
        numel *= d
    if (numel * ITEM_BITS[dtype] + 7) // 8 != offsets[1] - offsets[0]:
        raise CheckpointError(bad + f"tensor {name!r} of shape {shape} in {dtype} needs "
                              f"{(numel * ITEM_BITS[dtype] + 7) // 8:,} bytes; its data_offsets span "
                              f"{offsets[1] - offsets[0]:,}")


def header_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The string metadata (``__metadata__``) of a checked safetensors header."""
    return dict(read_safetensors_header(path).get("__metadata__") or {})
