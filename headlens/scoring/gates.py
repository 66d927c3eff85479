"""Gates: the second half of the label of head types defined by their pattern *and* by what they write.

A gated detector (``Detector.gate``, :mod:`headlens.detectors.base`; the name movers) is scanned like any
pattern detector; then, on the same probe, the gate's statistic is measured per prompt and head
(``(P, L, H)``, e.g. each head's direct logit attribution to ``IO - S``), averaged over prompts with the
scores table's bootstrap (:func:`headlens.scoring.stats.summarize`), and the head keeps its pattern label
only when the gate's 95 % CI lies on the gate's side of zero and its mean is at least :data:`MIN_SHARE` of
the strongest head's (the same effect floor idea as the circuits'). The table gains the gate's columns
(``dla, dla_ci_low, dla_ci_high``; NaN on the rows of other detectors).
"""

from __future__ import annotations

from typing import Any

import torch

from headlens.detectors.base import Gate
from headlens.scoring.stats import N_BOOT, Summary, summarize

MIN_SHARE = 0.05  # a gated head writes at least this fraction of what the strongest head writes


def gate_columns(name: str) -> tuple[str, str, str]:
    """The scores-table columns of the gate called ``name``.

    >>> gate_columns("dla")
    ('dla', 'dla_ci_low', 'dla_ci_high')
    """
    return name, f"{name}_ci_low", f"{name}_ci_high"


def gate_summary(model: Any, gate: Gate, probe: Any, cache: dict, seed: int = 0, n_boot: int = N_BOOT) -> Summary:
    """The gate's per-head mean over the probe's prompts and its bootstrap CI (``(L * H,)`` tensors); one
    measurement per gate function and probe (``cache``), shared by the detectors that gate on it."""
    key = (gate.values, id(probe))
    if key not in cache:
        cache[key] = gate.values(model, probe, cache).to(torch.float64)  # (P, L, H)
    values = cache[key]
    P = values.shape[0]
    ones = torch.ones(P, dtype=torch.float64)
    return summarize(values.reshape(P, -1), ones, torch.zeros_like(ones), seed=seed, n_boot=n_boot)


def gate_passes(summary: Summary, sign: int, floor: float = MIN_SHARE) -> torch.Tensor:
    """``(L * H,)`` bool: the CI lies above zero (``sign`` +1) or below it (-1), and the mean is at least
    ``floor`` of the strongest head's (in absolute value): a head that writes a hundredth of what the
    strongest writer writes, however tight its CI, is not what the head type names.

    >>> s = Summary(torch.tensor([1.0, -1.0, 0.1, 0.01]), torch.tensor([0.5, -1.5, -0.2, 0.005]),
    ...             torch.tensor([1.5, -0.5, 0.4, 0.015]), 0.0, 3, 3)
    >>> gate_passes(s, +1).tolist(), gate_passes(s, -1).tolist()
    ([True, False, False, False], [False, True, False, False])
    """
    side = summary.ci_low > 0 if sign > 0 else summary.ci_high < 0
    return side & (summary.score.abs() >= floor * summary.score.abs().max())


def with_gate(rows: list[dict[str, Any]], gate: Gate, summary: Summary) -> list[dict[str, Any]]:
    """``rows`` (one per head, in head order) with the gate's columns filled in."""
    for i, row in enumerate(rows):
        row.update(zip(gate_columns(gate.name), (float(summary.score[i]), float(summary.ci_low[i]),
                                                 float(summary.ci_high[i])), strict=True))
    return rows
