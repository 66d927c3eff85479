"""What a GGUF file is, read from its header without reading its weights: the architecture, the
quantization types, the tokenizer's ``add_bos_token``; and the one-line refusals of a file headlens
cannot use (the ``gguf`` package missing, a missing path, a file that is not GGUF or is cut short, an
architecture this transformers does not read from GGUF). The cache and the loading are
:mod:`headlens.models.hf.gguf`'s.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headlens.errors import CheckpointError, ModelReferenceError

INSTALL_GGUF = "pip install 'headlens[gguf]' (or: pip install gguf)"
_MAGIC = b"GGUF"


def require_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ModelReferenceError(f"GGUF files need the gguf package: {INSTALL_GGUF}")


@dataclass(frozen=True)
class GGUFInfo:
    """What a GGUF file is, read from its header (no weights are read).

    Attributes:
        path: the file.
        sha256: hex digest of its bytes (the cache key).
        architecture: ``general.architecture`` (``llama``, ``qwen2``, ``gemma3`` ...).
        file_type: the file's main quantization (``Q4_1``), from ``general.file_type`` or the commonest type.
        tensor_types: quantization type -> number of tensors (``{"Q4_1": 210, "F32": 61, "Q8_0": 1}``).
        name: ``general.name`` when the file has one.
        add_bos_token: whether the file's tokenizer adds BOS by itself (None: not said).
    """

    path: Path
    sha256: str
    architecture: str
    file_type: str
    tensor_types: dict[str, int] = field(default_factory=dict)
    name: str = ""
    add_bos_token: bool | None = None

    def provenance(self, dtype: str = "float32") -> dict[str, Any]:
        return {"kind": "gguf", "file": str(self.path), "sha256": self.sha256, "architecture": self.architecture,
                "quantization": self.file_type, "tensor_types": dict(self.tensor_types),
                "dequantized_to": dtype}


def inspect_file(path: Path, sha256: str) -> GGUFInfo:
    """Read the header of ``path``, whose content hashes to ``sha256`` (one-line errors for a non-GGUF,
    truncated or unsupported file)."""
    require_gguf()
    import gguf

    header = read_header(path)
    meta = header.meta
    types = Counter(gguf.GGMLQuantizationType(t.ggml_type).name for t in header.tensors)  # checked by read_header
    ftype = meta.get("general.file_type")
    try:
        main = gguf.LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_").removeprefix("ALL_") \
            if ftype is not None else ""
    except (ValueError, TypeError, OverflowError):  # a flipped byte: guessed from the tensors below
        main = ""
    if not main or main == "GUESSED":
        main = next((t for t, _ in types.most_common() if t not in ("F32", "F16")), "F32" if types else "")
    bos = meta.get("tokenizer.ggml.add_bos_token")
    info = GGUFInfo(path.resolve(), sha256, str(meta.get("general.architecture") or ""), main,
                    dict(types.most_common()), str(meta.get("general.name") or ""), None if bos is None else bool(bos))
    check_architecture(info)
    return info


def check_magic(path: Path) -> None:
    """A missing path or a file that is not GGUF, in one line."""
    if not path.is_file():
        raise ModelReferenceError(f"no such GGUF file {str(path)!r}" + (" (it is a directory)" if path.is_dir() else ""))
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != _MAGIC:
        raise CheckpointError(f"{str(path)!r} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")


def supported_architectures() -> list[str]:
    """The ``general.architecture`` values this transformers reads from GGUF (its legacy reader's and the newer one's)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    known = set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}
    try:
        from transformers.integrations.gguf import GGUF_CONFIG_ARCHS

        known |= set(GGUF_CONFIG_ARCHS)
    except ImportError:  # a transformers before the newer reader
        pass
    return sorted(known)


def check_architecture(info: GGUFInfo) -> None:
    known = supported_architectures()
    if info.architecture not in known:
        import transformers

        raise ModelReferenceError(
            f"{str(info.path)!r}: architecture {info.architecture or '(none)'!r} is not one transformers "
            f"{transformers.__version__} reads from GGUF (it reads {', '.join(known)})")


UNQUANTIZED = ("F32", "F16", "BF16", "F64")  # float tensors: read exactly, nothing rounded to blocks


def dequantized_note(name: str, info: GGUFInfo, dtype: str = "float32") -> str:
    """The one line every GGUF load prints: what runs is the quantized model (or, for a float file, the file's
    own float weights). A file type names a mix (``Q4_K_M``: Q4_K and Q6_K tensors), so the counts are the
    tensors' own types, quantized ones first.

    >>> info = GGUFInfo(Path("m.gguf"), "0" * 64, "llama", "Q4_K_M", {"F32": 109, "Q4_K": 96, "Q6_K": 13})
    >>> dequantized_note("m", info, "bfloat16")
    "'m': dequantized from Q4_K_M (Q4_K 96, Q6_K 13 tensors; F32 109) to bfloat16: headlens analyses the quantized model, not the original float weights"
    """
    quantized = {t: n for t, n in info.tensor_types.items() if t not in UNQUANTIZED}
    if not quantized:
        kinds = ", ".join(f"{t} {n}" for t, n in info.tensor_types.items())
        return f"{name!r}: GGUF float weights ({kinds} tensors) read as {dtype}: nothing in the file is quantized"
    floats = ", ".join(f"{t} {n}" for t, n in info.tensor_types.items() if t in UNQUANTIZED)
    counts = ", ".join(f"{t} {n}" for t, n in quantized.items()) + " tensors" + (f"; {floats}" if floats else "")
    return (f"{name!r}: dequantized from {info.file_type} ({counts}) to {dtype}: headlens analyses the "
            f"quantized model, not the original float weights")


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_MAX_DIMS = 4  # ggml's GGML_MAX_DIMS


@dataclass(frozen=True)
class TensorEntry:
    """One row of a GGUF's tensor table."""

    name: str
    shape: tuple[int, ...]  # in torch order (ggml lists the fastest dimension first)
    ggml_type: int  # gguf.GGMLQuantizationType's value
    offset: int  # from the start of the data section


@dataclass(frozen=True)
class Header:
    """A GGUF file's metadata (scalars and strings; an array as its length, or its values when numbers),
    its tensor table and where the tensor data starts."""

    meta: dict[str, Any]
    tensors: list[TensorEntry]
    data_start: int


class _Corrupt(Exception):
    """A field of the header out of range; its message names the field and the range."""


class _Cursor:
    """Reads a GGUF header field by field; every length, count and offset is checked against the bytes
    left before it is used, so a flipped byte is a ``_Corrupt`` naming the field, never a slice of 2**63
    bytes or a loop of 2**63 turns."""

    def __init__(self, blob: Any) -> None:
        self.blob, self.pos, self.size = blob, 0, len(blob)

    def unpack(self, fmt: str, field: str) -> tuple[Any, ...]:
        import struct

        n = struct.calcsize(fmt)
        if self.pos + n > self.size:
            raise _Corrupt(f"{field} at byte {self.pos:,} runs past the end of the file")
        out = struct.unpack_from(fmt, self.blob, self.pos)
        self.pos += n
        return out

    def count(self, field: str, item_bytes: int) -> int:
        """A uint64 count of items of at least ``item_bytes`` bytes each, which must fit in what is left."""
        at = self.pos
        (n,) = self.unpack("<Q", field)
        left = self.size - self.pos
        if n * item_bytes > left:
            size = f"{n:,} bytes" if item_bytes == 1 else f"{n:,} (at least {n * item_bytes:,} bytes)"
            raise _Corrupt(f"{field} is {size} at byte {at:,}, past the end of the file ({left:,} bytes left)")
        return n

    def skip_strings(self, n: int, field: str) -> None:
        """Walk ``n`` strings without decoding them (a vocabulary: one loop, no call per string)."""
        import struct

        blob, pos, size, unpack = self.blob, self.pos, self.size, struct.unpack_from
        for i in range(n):
            if pos + 8 > size:
                raise _Corrupt(f"string {i + 1:,} of {field} starts past the end of the file")
            length = unpack("<Q", blob, pos)[0]
            if pos + 8 + length > size:
                raise _Corrupt(f"the length of string {i + 1:,} of {field} is {length:,} bytes at byte {pos:,}, "
                               f"past the end of the file ({size - pos - 8:,} bytes left)")
            pos += 8 + length
        self.pos = pos

    def string(self, field: str) -> str:
        n = self.count(f"the length of {field}", 1)
        raw = bytes(self.blob[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise _Corrupt(f"{field} is not UTF-8 ({err.reason} at byte {self.pos - n + err.start:,})") from None

    def value(self, kind: int, field: str) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind], field)[0]
        if kind == 8:
            return self.string(field)
        if kind != 9:
            raise _Corrupt(f"the type of {field} is {kind}, not a GGUF metadata type (0-12)")
        (item,) = self.unpack("<I", f"the item type of {field}")
        if item in _SCALARS:  # numbers: kept (per-layer head counts)
            import struct

            width = struct.calcsize(_SCALARS[item])
            n = self.count(f"the length of array {field}", width)
            return list(self.unpack(f"<{n}{_SCALARS[item][1]}", field))
        if item != 8:
            raise _Corrupt(f"the item type of array {field} is {item}, not a number or a string")
        n = self.count(f"the length of array {field}", 8)
        self.skip_strings(n, field)  # strings (a vocabulary): walked, counted
        return n


def read_header(path: Path) -> Header:
    """The file's header in a fraction of a second, without torch: the memory estimate
    (:mod:`headlens.models.memory`) runs before it is imported, and ``gguf.GGUFReader`` parses every
    vocabulary string into arrays (11 s for SmolLM2's 49k tokens, each time it is made; transformers' own
    reader imports torch). Every length, count, type, shape and offset is checked against the file before it
    is used: ``CheckpointError`` naming the field on a file cut short, not GGUF, or with a flipped byte.
    """
    import mmap

    require_gguf()
    check_magic(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as blob:
        try:
            return _parse(_Cursor(blob))
        except _Corrupt as err:
            raise CheckpointError(f"{str(path)!r} is a truncated or corrupt GGUF file: {err}") from None


def _parse(cur: _Cursor) -> Header:
    import gguf

    cur.pos = 4
    (version,) = cur.unpack("<I", "the version")
    if version not in (2, 3):
        raise _Corrupt(f"the version is {version}, not 2 or 3")
    n_tensors = cur.count("the tensor count", 8 + 4 + 8 + 4 + 8)  # name length, n_dims, one dim, type, offset
    n_kv = cur.count("the metadata count", 8 + 4)  # key length, type
    meta: dict[str, Any] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key {i + 1:,}")
        (kind,) = cur.unpack("<I", f"the type of {key!r}")
        meta[key] = cur.value(kind, repr(key))
    tensors = [_tensor(cur, i, gguf) for i in range(n_tensors)]
    align = meta.get("general.alignment", 32)
    if type(align) is not int or align <= 0 or align & (align - 1):
        raise _Corrupt(f"'general.alignment' is {align!r}, not a power of two")
    start = (cur.pos + align - 1) // align * align
    for t in tensors:
        end = start + t.offset + n_bytes(t)
        if end > cur.size:
            raise _Corrupt(f"tensor {t.name!r} ends at byte {end:,} of a {cur.size:,}-byte file")
    return Header(meta, tensors, start)


def _tensor(cur: _Cursor, i: int, gguf: Any) -> TensorEntry:
    name = cur.string(f"the name of tensor {i + 1:,}")
    (n_dims,) = cur.unpack("<I", f"the number of dimensions of {name!r}")
    if not 1 <= n_dims <= _MAX_DIMS:
        raise _Corrupt(f"tensor {name!r} has {n_dims:,} dimensions (1 to {_MAX_DIMS} expected)")
    dims = cur.unpack(f"<{n_dims}Q", f"the shape of {name!r}")
    kind, offset = cur.unpack("<IQ", f"the type and offset of {name!r}")
    try:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        raise _Corrupt(f"tensor {name!r} has type {kind}, not a ggml quantization type") from None
    n = 1
    for d in dims:
        n *= d
    if dims[0] % block or n // block * size > cur.size:
        raise _Corrupt(f"tensor {name!r} has shape {list(reversed(dims))} of type "
                       f"{gguf.GGMLQuantizationType(kind).name}: {n // block * size:,} bytes or rows not in "
                       f"blocks of {block}, in a {cur.size:,}-byte file")
    if offset > cur.size:
        raise _Corrupt(f"the offset of {name!r} is {offset:,}, past the end of the {cur.size:,}-byte file")
    return TensorEntry(name, tuple(reversed(dims)), kind, offset)


def n_bytes(entry: TensorEntry) -> int:
    """How many bytes the tensor's data takes in the file (blocks of its quantization type)."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(entry.ggml_type)]
    n = 1
    for d in entry.shape:
        n *= d
    return n // block * size
