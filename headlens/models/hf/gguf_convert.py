"""A GGUF file into a Hugging Face folder one tensor at a time, in the dtype asked for.

Why it looks like this:

* **Bounded memory.** transformers' own GGUF loader dequantizes every tensor into one state dict and
  builds the model beside it (and the old cache held float32, cast after loading): a first load peaked
  at 1.5x the model in float32 and 4.4x it in bfloat16. Here the file is read memory-mapped (its table
  by :func:`headlens.models.hf.gguf_file.read_header`: ``gguf.GGUFReader`` takes 11 s on SmolLM2's
  vocabulary), each tensor is dequantized by ``gguf.dequantize``, put through transformers' own
  per-architecture ``TensorProcessor`` (Llama's q/k un-permutation, Gemma's ``1 + w`` norms, GPT-2's
  transposes: reused, not rewritten), cast to the dtype and written to disk before the next one is
  read. The peak is about the largest tensor in float32 plus its cast, plus the interpreter.
* **The file's pages are given back** after each tensor (``madvise(MADV_DONTNEED)``): pages of a
  mapping that were read count as resident until the mapping goes, so without it the whole file would.
* **One ``model.safetensors``, written as it goes.** Its header (names, dtypes, shapes, offsets) is
  only known at the end, so room for it is reserved first and filled last, padded with spaces as the
  format allows; the folder stays the one-file directory the rest of headlens (the doctor) reads.
* **Byte for byte what transformers' loader gives** in the same dtype: the same dequantize, the same
  processor, the same ``torch.from_numpy(...).to(dtype)`` (tests/models/test_gguf_convert.py, every
  family tests/gguf_files.py writes). Architectures transformers reads through its newer GGUF path
  (``GGUF_ARCHS``: lfm2, qwen35) are converted by ``from_pretrained`` itself: right, not bounded.
"""

from __future__ import annotations

import copy
import errno
import json
import mmap
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from headlens.errors import HeadlensError, ModelReferenceError
from headlens.models.checkpoint import check_finite
from headlens.models.hf.gguf_file import GGUFInfo, TensorEntry, n_bytes, read_header

WEIGHTS = "model.safetensors"
_ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64"}
_ENTRY_BYTES = 200  # '{"dtype":"BF16","shape":[...],"data_offsets":[a,b]}' beyond its name, 20-digit numbers


def convert(info: GGUFInfo, out: Path, dtype: str) -> dict[str, Any]:
    """Write ``info.path`` into ``out`` as ``config.json``, ``model.safetensors`` (in ``dtype``: float32,
    bfloat16, float16) and the file's tokenizer; returns what the marker records (seconds, largest tensor)."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    transformers.utils.logging.disable_progress_bar()
    folder, name = str(info.path.parent), info.path.name
    t0 = time.perf_counter()
    try:
        with _header_read_once():
            config = AutoConfig.from_pretrained(folder, gguf_file=name)
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            largest = write_weights(info, config, getattr(torch, dtype), out / WEIGHTS)
    except HeadlensError:
        raise
    except Exception as err:  # transformers raises ValueError, KeyError, OSError ... on what it cannot map
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise  # the cache's disk is full: the caller says so
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ModelReferenceError(f"transformers could not read {str(info.path)!r} "
                                  f"(architecture {info.architecture!r}): {first}") from None
    config_dict = config.to_dict()
    for key in ("quantization_config", "_name_or_path"):
        config_dict.pop(key, None)
    arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    config_dict["architectures"] = [arch] if arch else config_dict.get("architectures")
    config_dict["torch_dtype"] = config_dict["dtype"] = dtype
    (out / "config.json").write_text(json.dumps(config_dict, indent=2, default=str))
    tokenizer.save_pretrained(str(out))
    _tokenizer_config(out, info.add_bos_token)
    return {"seconds": round(time.perf_counter() - t0, 2), "largest_tensor_bytes": largest}


@contextmanager
def _header_read_once() -> Iterator[None]:
    """transformers reads a GGUF's header through ``load_gguf_checkpoint`` for the config, again for the
    tokenizer's config, and the processors need it a third time; each parses the whole vocabulary
    (``gguf.GGUFReader``: 11 s on SmolLM2's 49k tokens). While this is open, the header-only calls read
    each file once, and every caller gets its own copy of the result."""
    from transformers import modeling_gguf_pytorch_utils as readers

    original, memo = readers.load_gguf_checkpoint, {}

    def once(path: Any, return_tensors: bool = False, **kwargs: Any) -> Any:
        if return_tensors or kwargs:
            return original(path, return_tensors=return_tensors, **kwargs)
        if str(path) not in memo:
            memo[str(path)] = original(path)
        return copy.deepcopy(memo[str(path)])

    readers.load_gguf_checkpoint = once
    try:
        yield
    finally:
        readers.load_gguf_checkpoint = original


def write_weights(info: GGUFInfo, config: Any, dtype: Any, path: Path) -> int:
    """The file's tensors as transformers names and processes them, cast to ``dtype``, streamed into
    ``path``; returns the largest tensor's size in bytes as written."""
    from transformers.integrations.gguf.utils import is_gguf_arch_supported

    tensors = _whole_model(info, dtype) if is_gguf_arch_supported(info.architecture) else \
        _one_at_a_time(info, config, dtype)
    n_names, longest = next(tensors)
    largest = 0
    with _StreamedSafetensors(path, reserve=n_names * (longest + _ENTRY_BYTES) + 1024) as writer:
        for key, tensor in tensors:
            check_finite(info.path, [(key, tensor)])  # a flipped byte in a block's scale dequantizes to inf
            largest = max(largest, writer.add(key, tensor))
    return largest


def _one_at_a_time(info: GGUFInfo, config: Any, dtype: Any) -> Iterator[Any]:
    """First ``(how many names at most, the longest name)``, then ``(name, tensor)`` one at a time: the
    loop of transformers' ``load_gguf_checkpoint`` with each tensor handed on instead of kept."""
    import gguf
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM
    from transformers import modeling_gguf_pytorch_utils as readers
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
    )

    parsed = readers.load_gguf_checkpoint(str(info.path))  # the header only: the config dict the processors read
    processor = TENSOR_PROCESSORS.get(info.architecture, TensorProcessor)(config=parsed["config"])
    with torch.device("meta"):  # names only: no weight is allocated
        skeleton = AutoModelForCausalLM.from_config(config)
    names = get_gguf_hf_weights_map(skeleton, processor)
    del skeleton
    header = read_header(info.path)
    blob = np.memmap(info.path, mode="r", dtype=np.uint8)  # pages read only when a tensor is
    yield len(names) + len(header.tensors), max(map(len, [*names.values(), "x"]))
    parsed["tensors"] = {}  # where a processor assembles tensors itself (MoE experts)
    for entry in header.tensors:
        qtype = gguf.GGMLQuantizationType(entry.ggml_type)
        weights = gguf.dequantize(_stored(blob, header.data_start, entry), qtype)
        result = processor.process(weights=weights, name=entry.name, tensor_key_mapping=names,
                                   parsed_parameters=parsed)
        if result.name in names:
            array = result.weights if result.weights.flags.writeable else np.copy(result.weights)
            yield names[result.name], torch.from_numpy(array).to(dtype)
        del weights, result
        _release(blob, header.data_start + entry.offset, n_bytes(entry))
    for key in list(parsed["tensors"]):
        yield key, parsed["tensors"].pop(key).to(dtype)


def _stored(blob: Any, data_start: int, entry: TensorEntry) -> Any:
    """The tensor's bytes as ``gguf.GGUFReader`` hands them to ``dequantize``: plain float types viewed as
    such in their shape, block types as bytes, ``(..., blocks per row x block bytes)``."""
    import numpy as np

    start = data_start + entry.offset
    raw = blob[start:start + n_bytes(entry)]
    plain = {0: np.float32, 1: np.float16, 28: np.float64}.get(entry.ggml_type)  # F32, F16, F64
    if plain is not None:
        return raw.view(plain).reshape(entry.shape)
    return raw.reshape(*entry.shape[:-1], -1)  # (..., row bytes)


def _whole_model(info: GGUFInfo, dtype: Any) -> Iterator[Any]:
    """transformers' newer GGUF path (its own conversion ops): the model loaded whole, its weights handed
    on once each (a tied head is tied again on load)."""
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    model = AutoModelForCausalLM.from_pretrained(str(info.path.parent), gguf_file=info.path.name, dtype=dtype,
                                                 quantization_config=GgufConfig(dequantize=True))
    state = model.state_dict()
    yield len(state), max(map(len, [*state, "x"]))
    seen: set[int] = set()
    for key, tensor in state.items():
        if tensor.untyped_storage().data_ptr() in seen and model.config.get_text_config().tie_word_embeddings:
            continue
        seen.add(tensor.untyped_storage().data_ptr())
        yield key, tensor.detach().to(torch.device("cpu"))


def _release(blob: Any, start: int, length: int) -> None:
    """Hand a tensor's pages back to the page cache: read pages of a mapping count as resident."""
    mapped = getattr(blob, "_mmap", None)
    if mapped is None or not hasattr(mapped, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    aligned = start // mmap.PAGESIZE * mmap.PAGESIZE
    mapped.madvise(mmap.MADV_DONTNEED, aligned, start + length - aligned)


class _StreamedSafetensors:
    """A safetensors file written a tensor at a time: room for the header first, the header last.

    The format is an 8-byte little-endian header length, a JSON header (which may end in spaces), then
    the tensors' bytes back to back in the order the header's offsets give.
    """

    def __init__(self, path: Path, reserve: int) -> None:
        self.path, self.reserve = path, (reserve + 7) // 8 * 8
        self.entries: dict[str, Any] = {}
        self.offset = 0

    def __enter__(self) -> _StreamedSafetensors:
        self.file = open(self.path, "wb")  # closed in __exit__
        self.file.seek(8 + self.reserve)
        return self

    def add(self, name: str, tensor: Any) -> int:
        import torch

        flat = tensor.detach().contiguous().reshape(-1)  # (n,) in the tensor's dtype
        data = flat.view(torch.uint8).numpy()  # (n * itemsize,) raw bytes, no copy
        self.file.write(memoryview(data))
        kind = _ST_DTYPES[str(tensor.dtype).removeprefix("torch.")]
        self.entries[name] = {"dtype": kind, "shape": list(tensor.shape),
                              "data_offsets": [self.offset, self.offset + data.nbytes]}
        self.offset += data.nbytes
        return data.nbytes

    def __exit__(self, kind: Any, *rest: Any) -> None:
        try:
            if kind is None:
                header = json.dumps({"__metadata__": {"format": "pt"}, **self.entries},
                                    separators=(",", ":")).encode()
                if len(header) > self.reserve:
                    raise ModelReferenceError(f"{len(self.entries)} tensors need a {len(header):,}-byte header; "
                                              f"{self.reserve:,} bytes were reserved (a headlens bug: report it)")
                self.file.seek(0)
                self.file.write(struct.pack("<Q", self.reserve) + header + b" " * (self.reserve - len(header)))
        finally:
            self.file.close()


def _tokenizer_config(out: Path, add_bos: bool | None) -> None:
    """The folder says what the file says: the generic fast class (``headlens.models.hf.gguf.file_tokenizer``)
    and the file's ``add_bos_token``."""
    from transformers import PreTrainedTokenizerFast

    cfg = out / "tokenizer_config.json"
    if not cfg.is_file():
        return
    data = json.loads(cfg.read_text())
    data["tokenizer_class"] = PreTrainedTokenizerFast.__name__
    if add_bos is not None:
        data["add_bos_token"] = bool(add_bos)
    cfg.write_text(json.dumps(data, indent=2))
