"""Will the model fit? What a model needs, from its files' headers, against the memory there is: said
before any weight is read, so the kernel's OOM killer never ends a run headlens could have warned about.

Why it looks like this:

* **Headers, not weights.** A GGUF's tensor table (:func:`headlens.models.hf.gguf_file.read_header`),
  a safetensors file's JSON header, a directory's ``config.json``: the parameter count, the heads and
  the vocabulary, in well under a second, torch not imported.
* **What a run holds**: the weights in the dtype asked for, plus one batch's activations, dominated
  by the logits (``B x T x V`` float32, which the metrics read) and an attention layer's scores and
  pattern (``2 x B x H x T x T`` float32); times :data:`MARGIN` for the hooks' sums and the allocator,
  plus :data:`BASE` for the interpreter with torch and transformers (classify's peak measured at
  0.95-1.1x weights plus a batch from 1B parameters, about 0.5 GB above it below: benchmarks/scale.py).
* **What there is**: ``/proc/meminfo``'s MemAvailable, lowered by a cgroup limit when the process
  runs under one (``memory.max`` less ``memory.current``; cgroup v1's ``limit_in_bytes``);
  ``$HEADLENS_MEMORY_LIMIT`` (``6GB``, ``512MiB``, bytes) replaces both (tests, a self-imposed cap).
* **Only where it can tell.** On a GPU, with ``device_map`` (accelerate places the layers, the disk
  included) or where /proc says nothing, there is no check; an unknown reference is left to the loader.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headlens.errors import ConfigError, MemoryLimitError

ENV = "HEADLENS_MEMORY_LIMIT"
MARGIN = 1.2  # over weights + activations: hook reductions, allocator slack
BASE = 500_000_000  # Python with torch and transformers imported (0.5 GB: benchmarks/scale.py's small sizes)
DEFAULT_BATCH = (32, 64)  # classify's batch_size and seq_len (scoring/ comes after models/; a test keeps them equal)
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 2**10, "m": 1e6, "mb": 1e6, "mib": 2**20,
          "g": 1e9, "gb": 1e9, "gib": 2**30, "t": 1e12, "tb": 1e12, "tib": 2**40}


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know of a model, read from headers."""

    n_params: int  # every stored weight (a tied head counted once, as it is held once)
    n_heads: int  # query heads per layer (the attention pattern's H)
    d_vocab: int  # the logits' V


def parse_bytes(text: str) -> int:
    """``"6GB"``, ``"512MiB"``, ``"1e9"`` as bytes.

    >>> parse_bytes("512MiB"), parse_bytes("2 GB")
    (536870912, 2000000000)
    """
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"${ENV}={text!r} is not a size; expected bytes or a number with a unit "
                               f"(6GB, 512MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def available() -> tuple[int, str] | None:
    """``(bytes this process may still use, where that figure comes from)``, or None when unknown."""
    if os.environ.get(ENV):
        return parse_bytes(os.environ[ENV]), f"${ENV}"
    found = []
    try:
        meminfo = Path("/proc/meminfo").read_text()
        kb = re.search(r"^MemAvailable:\s+(\d+) kB", meminfo, re.MULTILINE)
        if kb:
            found.append((int(kb.group(1)) * 1024, "MemAvailable"))
    except OSError:
        return None
    if (room := _cgroup_room()) is not None:
        found.append((room, "the cgroup's memory limit"))
    return min(found) if found else None


def _cgroup_room() -> int | None:
    """What the cgroup limit leaves (v2 ``memory.max`` - ``memory.current``, v1 alike), None when unlimited."""
    for limit, usage in (("memory.max", "memory.current"),
                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            cap = Path("/sys/fs/cgroup", limit).read_text().strip()
            used = int(Path("/sys/fs/cgroup", usage).read_text().strip())
        except (OSError, ValueError):
            continue
        if cap.isdigit() and int(cap) < 2**60:  # v1 writes "no limit" as a huge number
            return max(int(cap) - used, 0)
    return None


def model_shape(ref: str) -> ModelShape | None:
    """The shape of the model ``ref`` names (``gguf:``/``.gguf``/``smollm2``, ``hf:<dir>``, ``hf:ORG/NAME``
    from the cache, a zoo name, a ``.safetensors`` checkpoint), from headers; None when it cannot tell."""
    from headlens.models.hf.gguf import parse_reference
    from headlens.zoo import ZOO

    if (path := parse_reference(ref)) is not None:
        return _gguf_shape(path) if path.is_file() else None
    if ref in ZOO:
        ref = f"hf:{ZOO[ref].path}" if ZOO[ref].format == "hf" else str(ZOO[ref].path)
    if ref.startswith("hf:"):
        from headlens.models.hf.hub import resolve

        # config.json only (a hub miss is its own one-line error); whether the repository's code may run is
        # the loader's question, asked with the user's --trust-remote-code right after
        src = resolve(ref[3:], trust_remote_code=True)
        return _hf_shape(src.files, src.config)
    path = Path(ref).expanduser()
    if path.is_file() and path.suffix == ".safetensors":
        header = _safetensors_header(path)
        try:  # a config that does not parse is the loader's to refuse, in its words
            config = json.loads(header.get("__metadata__", {}).get("config", "{}") or "{}")
            heads, vocab = int(config.get("n_heads", 1)), int(config.get("d_vocab", 1))
        except (ValueError, TypeError, AttributeError):
            heads, vocab = 1, 1
        return ModelShape(_numel(header), max(heads, 1), max(vocab, 1))
    return None


def _gguf_shape(path: Path) -> ModelShape:
    from headlens.models.hf.gguf_file import read_header

    header = read_header(path)
    meta = header.meta
    arch = meta.get("general.architecture", "")
    heads = meta.get(f"{arch}.attention.head_count", 1)
    vocab = meta.get(f"{arch}.vocab_size") or meta.get("tokenizer.ggml.tokens") or \
        next((t.shape[0] for t in header.tensors if t.name == "token_embd.weight"), 1)
    n_params = sum(_product(t.shape) for t in header.tensors)
    return ModelShape(n_params, max(heads) if isinstance(heads, list) else int(heads), int(vocab))


def _hf_shape(folder: Path, config: dict[str, Any]) -> ModelShape | None:
    text = config.get("text_config") or config
    heads = text.get("num_attention_heads") or text.get("n_head") or text.get("num_heads") or 1
    vocab = text.get("vocab_size") or config.get("vocab_size") or 1
    files = sorted(folder.glob("*.safetensors"))
    if files:
        n_params = sum(_numel(_safetensors_header(f)) for f in files)
    elif (index := folder / "model.safetensors.index.json").is_file():  # weights not fetched yet
        size = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        stored = ITEMSIZE.get(str(config.get("torch_dtype") or config.get("dtype") or "float32"), 4)
        n_params = int(size) // stored if size else 0
    else:
        return None
    return ModelShape(n_params, int(heads), int(vocab)) if n_params else None


def _safetensors_header(path: Path) -> dict[str, Any]:
    from headlens.models.safetensors_file import read_safetensors_header

    return read_safetensors_header(path)


def _numel(header: dict[str, Any]) -> int:
    return sum(_product(e["shape"]) for k, e in header.items() if k != "__metadata__")


def _product(shape: Any) -> int:
    out = 1
    for d in shape:
        out *= int(d)
    return out


def needed(shape: ModelShape, dtype: str, batch_size: int, seq_len: int) -> tuple[int, int]:
    """``(weights, activations)`` in bytes: the weights in ``dtype``; one batch's float32 logits
    ``(B, T, V)`` and one layer's attention scores and pattern ``(B, H, T, T)`` twice.

    >>> needed(ModelShape(1_000_000, 4, 100), "bfloat16", 2, 8)
    (2000000, 10496)
    """
    weights = shape.n_params * ITEMSIZE[dtype]
    activations = 4 * batch_size * seq_len * (shape.d_vocab + 2 * shape.n_heads * seq_len)
    return weights, activations


def gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.1f}M"


def check_fits(ref: str, dtype: str = "float32", device: str = "cpu", batch: tuple[int, int] | None = None,
               device_map: Any = None) -> None:
    """Refuse, in one line with the numbers and the ways out, a model that will not fit in memory.

    Args:
        ref: the model reference, as ``headlens.load`` takes it.
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        device: only ``cpu`` is checked (a GPU's memory is the framework's to report).
        batch: ``(batch_size, seq_len)`` of the largest forward the run will make (default: classify's).
        device_map: given, accelerate places the layers (the disk included): nothing is checked.

    Raises:
        MemoryLimitError: when weights + activations, times :data:`MARGIN`, plus :data:`BASE`, exceed what
            is available.
    """
    if device_map is not None or not str(device).startswith("cpu"):
        return
    try:
        shape, room = model_shape(ref), available()
    except (OSError, ValueError, KeyError, TypeError):  # a header it cannot read: the loader will say why
        return
    if shape is None or room is None:
        return
    batch_size, seq_len = batch or DEFAULT_BATCH
    weights, activations = needed(shape, dtype, batch_size, seq_len)
    need = BASE + int(MARGIN * (weights + activations))
    if need <= room[0]:
        return
    half = "" if dtype != "float32" else f"--dtype bfloat16 (weights {gb(weights / 2)}), "
    raise MemoryLimitError(
        f"{ref!r} needs about {gb(need)} ({_count(shape.n_params)} parameters: weights {gb(weights)} in "
        f"{dtype}, activations {gb(activations)} for a batch of {batch_size} x {seq_len} tokens, x{MARGIN} "
        f"+ {gb(BASE)} for the interpreter) but {gb(room[0])} is available ({room[1]}); ways out: {half}a smaller --batch-size, or "
        f"--device-map auto --offload-folder DIR (layers on disk)")


def release_freed() -> None:
    """Hand the heap's freed memory back to the system (glibc's ``malloc_trim``; nothing elsewhere).

    Tensors of a few MB come from the heap, not from their own mappings (glibc raises its mmap threshold to
    the largest block freed, up to 32 MB), and glibc keeps what they free: after circuit discovery's gradient
    first pass on SmolLM2, 0.7 GB of a 2.0 GB resident set was freed memory, which the exact rounds then
    stacked their own on. Called between the phases of a long run (a few ms), not inside them."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        trim = getattr(libc, "malloc_trim", None)
    except OSError:
        return
    if trim is not None:
        trim(0)
