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
    try:
        types = Counter(gguf.GGMLQuantizationType(t.ggml_type).name for t in header.tensors)
    except ValueError as err:
        raise CheckpointError(f"{str(path)!r} is a truncated or corrupt GGUF file ({err})") from None
    ftype = meta.get("general.file_type")
    try:
        main = gguf.LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_").removeprefix("ALL_") \
            if ftype is not None else ""
    except ValueError:
        main = ""
    if not main or main == "GUESSED":
        main = next((t for t, _ in types.most_common() if t not in ("F32", "F16")), "F32" if types else "")
    bos = meta.get("tokenizer.ggml.add_bos_token")
    info = GGUFInfo(path.resolve(), sha256, str(meta.get("general.architecture") or ""), main,
                    dict(types.most_common()), str(meta.get("general.name") or ""), None if bos is None else bool(bos))
    _check_complete(path, header)
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


def _check_complete(path: Path, header: Header) -> None:
    """The tensors' data must lie inside the file (a download cut short has a full header, short data)."""
    size = path.stat().st_size
    for t in header.tensors:
        end = header.data_start + t.offset + n_bytes(t)
        if end > size:
            raise CheckpointError(f"{str(path)!r} is a truncated or corrupt GGUF file (tensor {t.name!r} ends "
                                  f"at byte {end:,} of a {size:,}-byte file)")


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


def read_header(path: Path) -> Header:
    """The file's header in a fraction of a second, without numpy or torch: the memory estimate
    (:mod:`headlens.models.memory`) runs before they are imported, and ``gguf.GGUFReader`` parses every
    vocabulary string into arrays (11 s for SmolLM2's 49k tokens, each time it is made; transformers' own
    reader imports torch). Raises ``CheckpointError`` on a file cut short or not GGUF.
    """
    import mmap
    import struct

    check_magic(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as blob:
        try:
            _, n_tensors, n_kv = struct.unpack_from("<IQQ", blob, 4)
            pos, meta = 24, {}
            for _ in range(n_kv):
                key, pos = _string(blob, pos)
                (kind,) = struct.unpack_from("<I", blob, pos)
                meta[key], pos = _value(blob, pos + 4, kind)
            tensors = []
            for _ in range(n_tensors):
                name, pos = _string(blob, pos)
                (n_dims,) = struct.unpack_from("<I", blob, pos)
                dims = struct.unpack_from(f"<{n_dims}Q", blob, pos + 4)
                kind, offset = struct.unpack_from("<IQ", blob, pos + 4 + 8 * n_dims)
                pos += 4 + 8 * n_dims + 12
                tensors.append(TensorEntry(name, tuple(reversed(dims)), kind, offset))
        except (struct.error, ValueError, UnicodeDecodeError) as err:
            raise CheckpointError(f"{str(path)!r} is a truncated or corrupt GGUF file ({err})") from None
    align = int(meta.get("general.alignment", 32))
    return Header(meta, tensors, (pos + align - 1) // align * align)


def n_bytes(entry: TensorEntry) -> int:
    """How many bytes the tensor's data takes in the file (blocks of its quantization type)."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(entry.ggml_type)]
    n = 1
    for d in entry.shape:
        n *= d
    return n // block * size


def _string(blob: Any, pos: int) -> tuple[str, int]:
    import struct

    (n,) = struct.unpack_from("<Q", blob, pos)
    return bytes(blob[pos + 8:pos + 8 + n]).decode("utf-8"), pos + 8 + n


def _value(blob: Any, pos: int, kind: int) -> tuple[Any, int]:
    import struct

    if kind in _SCALARS:
        return struct.unpack_from(_SCALARS[kind], blob, pos)[0], pos + struct.calcsize(_SCALARS[kind])
    if kind == 8:
        return _string(blob, pos)
    if kind != 9:
        raise ValueError(f"unknown metadata type {kind}")
    item, n = struct.unpack_from("<IQ", blob, pos)
    pos += 12
    if item in _SCALARS:  # numbers: kept (per-layer head counts)
        fmt = f"<{n}{_SCALARS[item][1]}"
        return list(struct.unpack_from(fmt, blob, pos)), pos + struct.calcsize(fmt)
    for _ in range(n):  # strings (a vocabulary): walked, counted
        if item != 8:
            raise ValueError(f"an array of metadata type {item}")
        (length,) = struct.unpack_from("<Q", blob, pos)
        pos += 8 + length
    return n, pos
