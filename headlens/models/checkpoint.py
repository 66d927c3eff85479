"""Checkpoints: safetensors weights with the config in the header; never pickle.

Why the config lives in the file: a head layout is not visible in weight shapes. A
768 x 768 projection is the same tensor for 12 heads or 16, so a checkpoint trained
with one head count loads silently into a model configured with another and produces
garbage. A headlens checkpoint carries its own ModelConfig, and loading it under a
different one is a ``CheckpointError`` that names both values.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from headlens.errors import CheckpointError, ConfigError, ProbeError
from headlens.models.config import ModelConfig
from headlens.models.files import atomic_write
from headlens.models.gpt import GPT
from headlens.models.tokenizer import Tokenizer

FORMAT = "headlens-checkpoint-v1"


def save_checkpoint(
    model: GPT, path: str | os.PathLike, metadata: dict[str, Any] | None = None, half: bool = False
) -> Path:
    """Write ``model`` to ``path`` (atomically) with its config and tokenizer in the header.

    Args:
        model: the native model to save.
        path: destination ``.safetensors`` file.
        metadata: extra JSON-serialisable facts (recipe, step, losses) kept in the header.
        half: store weights as float16 (halves the size; loaded back as float32).
    """
    from safetensors.torch import save_file

    path = Path(path)
    tensors = {}
    for name, tensor in model.state_dict().items():
        if model.cfg.tie_embeddings and name == "lm_head.weight":
            continue  # tied to wte; safetensors refuses shared storage
        t = tensor.detach().to("cpu").contiguous()
        tensors[name] = t.half() if half else t.float()
    header = {
        "format": FORMAT,
        "config": model.cfg.to_json(),
        "tokenizer": json.dumps(model.tokenizer.to_spec()),
        "name": model.name,
        "metadata": json.dumps(metadata or {}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=header))  # the umask's mode, not 0600
    return path


def read_header(path: str | os.PathLike) -> dict[str, str]:
    """The string metadata of a safetensors file, or a ``CheckpointError`` saying why not."""
    from headlens.models.safetensors_file import header_metadata

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    return header_metadata(path)


def load_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The extra metadata (recipe, losses, step ...) stored with a headlens checkpoint."""
    try:
        meta = json.loads(read_header(path).get("metadata", "{}"))
    except ValueError as err:
        raise CheckpointError(f"checkpoint {str(path)!r} has unreadable metadata ({err})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"checkpoint {str(path)!r} has metadata that is not a JSON object")
    return meta


def check_finite(path: str | os.PathLike, tensors: Any) -> None:
    """Refuse weights holding NaN or inf, naming the first such tensor: a flipped byte in a file's data
    section loads (the format cannot tell), and would turn every score downstream into NaN.

    Args:
        path: the file, for the message.
        tensors: ``(name, tensor)`` pairs (``dict.items()``), floating tensors checked.

    >>> check_finite("m.safetensors", {"w": torch.tensor([1.0, float("nan")])}.items())
    Traceback (most recent call last):
    headlens.errors.CheckpointError: 'm.safetensors': tensor 'w' holds 1 NaN and 0 inf values of 2 (a corrupt file, or weights that diverged in training)
    """
    for name, t in tensors:
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
            raise CheckpointError(f"{str(path)!r}: tensor {name!r} holds {nan:,} NaN and {inf:,} inf values of "
                                  f"{t.numel():,} (a corrupt file, or weights that diverged in training)")


def _check_overrides(stored: ModelConfig, config: ModelConfig | dict[str, Any] | None) -> None:
    if config is None:
        return
    asked = config.to_dict() if isinstance(config, ModelConfig) else dict(config)
    have = stored.to_dict()
    for key, value in asked.items():
        if key == "extra":
            continue
        if key not in have:
            raise CheckpointError(f"unknown config field {key!r} asked of the checkpoint")
        if have[key] != value:
            raise CheckpointError(
                f"checkpoint was trained with {key}={have[key]!r} but {key}={value!r} was asked for; "
                f"loading it would run but compute garbage (same weight shapes, different head layout)"
            )


def load_checkpoint(
    path: str | os.PathLike,
    config: ModelConfig | dict[str, Any] | None = None,
    device: str | torch.device = "cpu",
    name: str | None = None,
) -> GPT:
    """Load a headlens checkpoint into a fresh ``GPT``.

    Args:
        path: a ``.safetensors`` file written by :func:`save_checkpoint`.
        config: optional expected config (or a dict of fields, e.g. ``{"n_heads": 12}``); any
            field that disagrees with the stored config is a ``CheckpointError`` naming both.
        device: where to put the weights.
        name: display name (defaults to the stored one).
    """
    from safetensors.torch import load_file

    header = read_header(path)
    if header.get("format") != FORMAT or "config" not in header:
        raise CheckpointError(
            f"{str(path)!r} is a safetensors file but not a headlens checkpoint (no config in its "
            f"header); for a Hugging Face directory use 'hf:<dir>'"
        )
    try:
        cfg = ModelConfig.from_json(header["config"])
    except ConfigError as err:
        raise CheckpointError(f"checkpoint {str(path)!r} has an invalid config: {err}") from None
    _check_overrides(cfg, config)
    try:
        tokenizer = Tokenizer.from_spec(json.loads(header.get("tokenizer", '{"kind": "byte"}')))
    except (json.JSONDecodeError, KeyError, TypeError, ProbeError) as err:
        raise CheckpointError(f"checkpoint {str(path)!r} has an invalid tokenizer spec ({err})") from None
    try:
        tensors = load_file(str(path))
    except Exception as err:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt or truncated ({err})") from None
    check_finite(path, tensors.items())
    try:
        model = GPT(cfg, tokenizer=tokenizer, name=name or header.get("name") or Path(path).stem)
    except (ConfigError, ProbeError) as err:  # a config that disagrees with its own tokenizer
        raise CheckpointError(f"checkpoint {str(path)!r} has an invalid config: {err}") from None
    expected = model.state_dict()
    if cfg.tie_embeddings:
        expected = {k: v for k, v in expected.items() if k != "lm_head.weight"}
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise CheckpointError(
            f"checkpoint {str(path)!r} does not match its config: missing tensors {missing[:5]}, "
            f"unexpected tensors {extra[:5]}"
        )
    for key, want in expected.items():
        if tuple(tensors[key].shape) != tuple(want.shape):
            raise CheckpointError(
                f"checkpoint tensor {key!r} has shape {tuple(tensors[key].shape)}, "
                f"config expects {tuple(want.shape)}"
            )
    model.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=not cfg.tie_embeddings)
    return model.to(device).eval()
