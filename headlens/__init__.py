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
    "GPT": "headlens.models.gpt",
    "ModelConfig": "headlens.models.config",
    "Tokenizer": "headlens.models.tokenizer",
    "load": "headlens.models.loading",
    "load_checkpoint": "headlens.models.checkpoint",
    "save_checkpoint": "headlens.models.checkpoint",
    "classify": "headlens.scoring.classification",
    "induction_curve": "headlens.scoring.induction_distance",
    "Detector": "headlens.detectors.base",
    "register_detector": "headlens.detectors",
    "trajectory": "headlens.scoring.series",
    "ablate": "headlens.interventions.ablation",
    "doctor": "headlens.doctor",
    "write_report": "headlens.viz.report",
    **{name: "headlens.errors" for name in (
        "CheckpointError", "ConfigError", "DetectorError", "HeadlensError", "ModelReferenceError",
        "OutputError", "ProbeError")},
}

if TYPE_CHECKING:
    from headlens import doctor
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
    from headlens.interventions.ablation import ablate
    from headlens.models.checkpoint import load_checkpoint, save_checkpoint
    from headlens.models.config import ModelConfig
    from headlens.models.gpt import GPT
    from headlens.models.loading import load
    from headlens.models.tokenizer import Tokenizer
    from headlens.scoring.classification import classify
    from headlens.scoring.induction_distance import induction_curve
    from headlens.scoring.series import trajectory
    from headlens.viz.report import write_report


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
