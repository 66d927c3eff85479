"""headlens: find out what every attention head of a transformer does.

``import headlens`` imports nothing heavy: torch is imported by the first name that needs it
(``headlens.load``, ``headlens.GPT``, ...), and pandas, plotly, streamlit and transformer_lens
by the functions that use them.

>>> import headlens
>>> model = headlens.load("induction-2l")  # doctest: +SKIP
>>> table = headlens.classify(model)  # doctest: +SKIP
>>> effects = headlens.sweep(model, metrics=["repeated_loss"])  # doctest: +SKIP

Every name in ``__all__`` is a function or a class. ``headlens.doctor`` stays importable, but it is the
doctor *package* (``headlens.doctor.check_checkpoint(path)``; ``headlens doctor`` on the command line),
so it is not in ``__all__``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
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
    "sweep": "headlens.interventions.sweep",
    "circuit": "headlens.circuits.api",
    "attribute": "headlens.readout.dla",
    "attribution_summary": "headlens.scoring.writers",
    "doctor": "headlens.doctor",  # the package, not a function: headlens.doctor.check_checkpoint(path)
    "write_report": "headlens.viz.report",
    "read_scores": "headlens.scoring.table",
    "write_scores": "headlens.scoring.table",
    "write_mib": "headlens.circuits.mib",
    **{name: "headlens.errors" for name in (
        "CheckpointError", "ConfigError", "DetectorError", "HeadlensError", "ModelReferenceError",
        "OutputError", "ProbeError")},
}

# Modules that moved when the package was laid out by pipeline stage (CHANGELOG.md): old path -> new path. The old
# paths still import for one release, with a DeprecationWarning, through the finder below
# (TransformerLens' way: nothing flat is left in the package, yet old imports keep working).
_MOVED = {
    **{f"headlens.{old}": f"headlens.models.{new}" for old, new in (
        ("config", "config"), ("model", "gpt"), ("hooks", "hooks"), ("checkpoint", "checkpoint"),
        ("tokenizer", "tokenizer"), ("vocab", "vocab"), ("placement", "placement"), ("loading", "loading"),
        ("export", "export"), ("backends", "hf"), ("backends.bridge", "hf.bridge"),
        ("backends.fused", "hf.fused"), ("backends.hf", "hf.boot"), ("backends.hub", "hf.hub"))},
    **{f"headlens.{old}": f"headlens.probes.{new}" for old, new in (
        ("haystack", "haystack"), ("spans", "spans"), ("coreference", "coreference"), ("texts", "texts"),
        ("zoo.data", "data"))},
    **{f"headlens.{old}": f"headlens.scoring.{new}" for old, new in (
        ("scan", "scan"), ("lse", "lse"), ("retrieval", "top1"), ("stats", "stats"),
        ("classification", "classification"), ("annotated", "annotated"), ("table", "table"),
        ("induction_distance", "induction_distance"), ("series", "series"), ("distributed", "distributed"),
        ("resume", "resume"))},
    # not "sweep": headlens.sweep is now the top-level function (the table behind `headlens ablate`)
    **{f"headlens.{m}": f"headlens.interventions.{m}" for m in ("ablation", "attribution", "confirm", "metrics")},
    **{f"headlens.{old}": f"headlens.viz.{new}" for old, new in (
        ("viz_patterns", "patterns"), ("viz_lesson", "lesson"), ("viz_compare", "compare"),
        ("viz_ranking", "ranking"), ("viz_training", "training"), ("tokenview", "tokenview"),
        ("report", "report"))},
    **{f"headlens.zoo.{m}": f"headlens.training.{m}" for m in ("train", "recipes", "llama", "evaluate",
                                                                "measure", "ship")},
    "headlens.lesson": "headlens.app.lesson",
}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a moved module under its old name: the new module itself, with a DeprecationWarning."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        return importlib.util.spec_from_loader(fullname, self) if fullname in _MOVED else None

    def create_module(self, spec: Any) -> Any:
        new = _MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; the old path goes in the next release",
                      DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        sys.modules[spec.name] = module
        return module

    def exec_module(self, module: Any) -> None:  # the new module is already executed
        pass


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedFinder())  # before the path finders: a moved package is never loaded twice


if TYPE_CHECKING:
    from headlens.circuits.api import circuit
    from headlens.circuits.mib import write_mib
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
    from headlens.interventions.sweep import sweep
    from headlens.models.checkpoint import load_checkpoint, save_checkpoint
    from headlens.models.config import ModelConfig
    from headlens.models.gpt import GPT
    from headlens.models.loading import load
    from headlens.models.tokenizer import Tokenizer
    from headlens.readout.dla import attribute
    from headlens.scoring.classification import classify
    from headlens.scoring.induction_distance import induction_curve
    from headlens.scoring.series import trajectory
    from headlens.scoring.table import read_scores, write_scores
    from headlens.scoring.writers import attribution_summary
    from headlens.viz.report import write_report


def load_ipython_extension(ip: Any) -> None:
    """``%load_ext headlens``: rich display of scores tables, edge tables and models (:mod:`headlens.viz.display`)."""
    importlib.import_module("headlens.viz.display").register(ip)


def _in_ipython() -> Any:
    """The running IPython shell, without importing IPython when it is not already loaded."""
    ipython = sys.modules.get("IPython")
    return None if ipython is None else getattr(ipython, "get_ipython", lambda: None)()


if (_shell := _in_ipython()) is not None:  # a notebook: tables and models show their rich views
    load_ipython_extension(_shell)


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
    "attribute",
    "attribution_summary",
    "circuit",
    "classify",
    "induction_curve",
    "load",
    "load_checkpoint",
    "read_scores",
    "register_detector",
    "save_checkpoint",
    "sweep",
    "trajectory",
    "write_mib",
    "write_report",
    "write_scores",
]
