"""Precision and placement: the ``--dtype`` and ``--device`` a model runs in.

A model may run in bfloat16 or float16 on a GPU; the scan's statistics are float64 sums
whatever the model runs in (``headlens.scoring.engine`` converts each pattern before it reduces), so a
lower precision changes the patterns a little and the bookkeeping not at all.
"""

from __future__ import annotations

from typing import Any

from headlens.errors import ConfigError

DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("cpu", "cuda", "mps", "auto")


def resolve_dtype(dtype: Any) -> Any:
    """``"bfloat16"`` (or a ``torch.dtype``, or None for float32) as a ``torch.dtype``.

    >>> resolve_dtype("bfloat16")
    torch.bfloat16
    """
    import torch

    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        name = str(dtype).removeprefix("torch.")
        if name not in DTYPES:
            raise ConfigError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
        return dtype
    return getattr(torch, dtype_name(dtype))


def dtype_name(dtype: str) -> str:
    """The canonical name (one of ``DTYPES``) of a dtype given by name, without importing torch.

    >>> dtype_name("bf16")
    'bfloat16'
    """
    name = str(dtype).strip().lower().removeprefix("torch.")
    name = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}.get(
        name, name)
    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    return name


def resolve_device(device: Any) -> str:
    """``"auto"`` -> the best available of cuda, mps, cpu; an unavailable one is refused.

    >>> resolve_device("cpu")
    'cpu'
    """
    import torch

    name = str(device if device is not None else "cpu").strip().lower()
    kind = name.split(":")[0]
    mps = getattr(torch.backends, "mps", None)
    mps_ok = bool(mps is not None and mps.is_available())
    if kind == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if mps_ok else "cpu"
    if kind not in DEVICES:
        raise ConfigError(f"unknown device {device!r}; expected one of {', '.join(DEVICES)}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} asked for, but this torch ({torch.__version__}) sees no CUDA GPU; "
                          f"use --device cpu or auto")
    if kind == "mps" and not mps_ok:
        raise ConfigError(f"device {name!r} asked for, but Apple's MPS is not available here; use --device cpu or auto")
    return name
