"""headlens: find out what every attention head of a transformer does.

``import headlens`` loads torch and the native model only; pandas, plotly,
streamlit and transformer_lens are imported by the functions that need them.

>>> import headlens
>>> model = headlens.load("induction-2l")  # doctest: +SKIP
>>> table = headlens.classify(model)  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

from headlens.checkpoint import load_checkpoint, save_checkpoint
from headlens.classify import classify
from headlens.config import ModelConfig
from headlens.errors import (
    CheckpointError,
    ConfigError,
    DetectorError,
    HeadlensError,
    ModelReferenceError,
    OutputError,
    ProbeError,
)
from headlens.loading import load
from headlens.model import GPT
from headlens.tokenizer import Tokenizer

__version__ = "0.1.0"

# classify is imported eagerly above: its submodule shares the name, so a lazy attribute would be
# shadowed by the module once anything imports headlens.classify.
# name -> module that defines it; imported on first use to keep `import headlens` fast
_LAZY = {
    "ablate": "headlens.ablation",
    "doctor": "headlens.doctor",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        return module if name == "doctor" else getattr(module, name)
    raise AttributeError(f"module 'headlens' has no attribute {name!r}")


__all__ = [
    "GPT",
    "CheckpointError",
    "ConfigError",
    "DetectorError",
    "HeadlensError",
    "ModelConfig",
    "ModelReferenceError",
    "OutputError",
    "ProbeError",
    "Tokenizer",
    "__version__",
    "ablate",
    "classify",
    "doctor",
    "load",
    "load_checkpoint",
    "save_checkpoint",
]
