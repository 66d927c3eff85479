"""The names users type, torch-free: built-in detectors, ablation methods, control scopes, task metrics, edge
ablation methods. The CLI refuses a mistyped name (with the closest valid ones) before torch is imported
(:mod:`headlens.cli.precheck`); each registry checks at import that it holds exactly these names
(:mod:`headlens.detectors`, :mod:`headlens.interventions.metrics`) or imports its tuple from here, so a name
cannot be added in one place only. They live in the zoo, the first package of the pipeline (every other may
read it) and one whose import stays torch-free, beside the zoo's own model names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from headlens.errors import DetectorError, did_you_mean

DETECTORS = ("previous_token", "next_token", "current_token", "first_token", "duplicate_token", "induction",
             "bracket_matching", "bracket_matching_hard", "open_bracket", "open_bracket_hard", "ov_copying",
             "ov_suppression", "successor", "coreference", "sink", "streaming", "retrieval", "name_mover",
             "negative_name_mover")  # the built-in detectors, in the registry's order
# old names of renamed detectors, read for one release (``--detectors``, saved score tables): the weight-only
# types are named for what they measure, the OV circuit; copy suppression proper needs the attention claim too
RENAMED = {"copying": "ov_copying", "copy_suppression": "ov_suppression"}
METHODS = ("zero", "mean", "resample", "uniform")  # how a head is ablated (headlens.interventions.ablation)
CONTROLS = ("layer", "model", "auto")  # where random control heads are drawn (headlens.interventions.controls)
METRICS = ("repeated_loss", "first_half_loss", "bracket_accuracy", "lm_loss", "kl", "needle_recall",
           "logit_diff")  # task metrics (headlens.interventions.metrics)
EDGE_METHODS = ("mean", "resample", "zero", "corrupted")  # how a circuit's sender is ablated (headlens.circuits)

ENTRY_POINT_GROUP = "headlens.detectors"  # where installed packages register their own detectors
_CALL = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*\((.*)\)\s*$")  # name(key=value, ...): a detector with settings


def split_names(names: str) -> list[str]:
    """``"a,streaming(s=1,w=8),b"`` -> ``["a", "streaming(s=1,w=8)", "b"]`` (commas inside parentheses kept).

    >>> split_names("previous_token, streaming(s=1,w=8),induction")
    ['previous_token', 'streaming(s=1,w=8)', 'induction']
    """
    return [n.strip() for n in re.split(r",(?![^()]*\))", names) if n.strip()]


def base_name(name: str) -> str:
    """The registered name a spelling refers to: ``"streaming(w=128)"`` -> ``"streaming"``.

    >>> base_name("streaming(w=128)"), base_name("induction")
    ('streaming', 'induction')
    """
    call = _CALL.match(name)
    return call.group(1) if call else name


def current_name(name: str) -> str:
    """``name`` under its current spelling: an old name of a renamed detector (:data:`RENAMED`) warns in one
    line (``DeprecationWarning``) and maps to the new one; any other name passes through.

    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     current_name("copying"), current_name("streaming(w=8)")
    ('ov_copying', 'streaming(w=8)')
    """
    if name not in RENAMED:
        return name
    import warnings

    warnings.warn(f"detector {name!r} is now {RENAMED[name]!r} (a score of the weights alone); the old name "
                  f"goes in the next release", DeprecationWarning, stacklevel=3)
    return RENAMED[name]


def unknown_detector(name: str, known: Iterable[str]) -> DetectorError:
    """The error for a detector name that is not registered, with the closest registered names."""
    known = list(known)
    return DetectorError(f"unknown detector {name!r}; expected one of {', '.join(known)}{did_you_mean(name, known)}")
