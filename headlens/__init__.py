"""headlens: find out what every attention head of a transformer does.

``import headlens`` imports nothing heavy: torch is imported by the first name that needs it
(``headlens.load``, ``headlens.GPT``, ...), and pandas, plotly, streamlit and transformer_lens
by the functions that use them.

>>> import headlens
>>> model = headlens.load("induction-2l")  # doctest: +SKIP
>>> table = headlens.classify(model)  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> module that defines it, imported on first use: `import headlens` costs no torch import,
# so `headlens --help` answers at once and `headlens dashboard` starts its server while torch loads.
_LAZY = {
    "GPT": "headlens.model",
    "ModelConfig": "headlens.config",
    "Tokenizer": "headlens.tokenizer",
    "load": "headlens.loading",
    "load_checkpoint": "headlens.checkpoint",
    "save_checkpoint": "headlens.checkpoint",
    "classify": "headlens.classification",
    "induction_curve": "headlens.induction_distance",
    "Detector": "headlens.detectors.base",
    "register_detector": "headlens.detectors",
    "trajectory": "headlens.series",
    "ablate": "headlens.ablation",
    "doctor": "headlens.doctor",
    "write_report": "headlens.report",
    **{name: "headlens.errors" for name in (
        "CheckpointError", "ConfigError", "DetectorError", "HeadlensError", "ModelReferenceError",
        "OutputError", "ProbeError")},
}

if TYPE_CHECKING:
    from headlens import doctor
    from headlens.ablation import ablate
    from headlens.checkpoint import load_checkpoint, save_checkpoint
    from headlens.classification import classify
    from headlens.config import ModelConfig
    from headlens.detectors import register_detector
    from headlens.detectors.base import Detector
    from headlens.errors import (
        CheckpointError,
        ConfigError,
        DetectorError,
        HeadlensError,
        ModelReferenceError,
        OutputError,
        ProbeError,
    )
    from headlens.induction_distance import induction_curve
    from headlens.loading import load
    from headlens.model import GPT
    from headlens.report import write_report
    from headlens.series import trajectory
    from headlens.tokenizer import Tokenizer


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        value = module if name == "doctor" else getattr(module, name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'headlens' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "GPT",
    "CheckpointError",
    "ConfigError",
    "Detector",
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
    "induction_curve",
    "load",
    "load_checkpoint",
    "register_detector",
    "save_checkpoint",
    "trajectory",
    "write_report",
]
