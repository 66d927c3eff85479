"""Weight detectors' statistics: a score per head from counts over sampled tokens, its interval, the label.

A weight detector (``kind == "weights"``: ``ov_copying``, ``ov_suppression``, ``successor``) returns
:class:`~headlens.detectors.base.WeightCounts`: per head, the trials it passes out of ``trials`` (source
tokens, list items), the rate of chance and the same count under its null. Here:

* ``score = hits / trials``, with Wilson's 95 % interval (the trials are independent draws of tokens, and
  a count of zero still has an upper end);
* ``baseline`` = chance, ``lift = score / chance``;
* the label (docs/scores.md): ``ci_low >= τ``, ``lift >= 3``, and ``ci_low`` above the upper end of the
  head's own null interval, so no head within chance of its null carries the label;
* the null's score goes into the ``null`` column, the detector's own extra values (``eigen``) into theirs,
  and a summary of the null over all heads into the provenance.

A detector that returns a plain ``(n_layers, n_heads)`` score tensor (older plugins) keeps the old form:
no interval, no lift, labelled at ``score >= τ``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from headlens.detectors.base import WeightCounts
from headlens.scoring.stats import MIN_LIFT, Summary, label, wilson


@dataclass(frozen=True)
class WeightSummary:
    """One weight detector's rows: the summary, the labels, extra columns (all ``(N,)`` over heads) and provenance."""

    summary: Summary
    labels: torch.Tensor
    columns: dict[str, torch.Tensor] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)


def summarize_weights(result: WeightCounts | torch.Tensor, threshold: float) -> WeightSummary:
    """Scores, intervals, lifts and labels of a weight detector's ``result`` (module docstring)."""
    if not isinstance(result, WeightCounts):
        sc = torch.as_tensor(result, dtype=torch.float64).reshape(-1)
        return WeightSummary(Summary(sc, sc, sc, 0.0, 0, 0), sc >= threshold)
    n = int(result.trials)
    hits = result.hits.double().reshape(-1)
    lo, hi = wilson(hits, n)
    s = Summary(hits / n, lo, hi, float(result.chance), n, 0)
    labels = label(lo, s.lift, threshold, MIN_LIFT)
    columns = {name: torch.as_tensor(v, dtype=torch.float64).reshape(-1) for name, v in result.columns.items()}
    attrs: dict[str, Any] = {**result.attrs, "trials": n, "chance": float(result.chance)}
    if result.null_hits is not None:
        null = result.null_hits.double().reshape(-1)
        labels &= lo > wilson(null, n)[1]  # above the upper end of the head's own null
        pooled = float(null.sum())
        plo, phi = wilson(torch.tensor([pooled]), n * len(null))
        columns = {"null": null / n, **columns}
        attrs["null_score"] = {"pooled": pooled / (n * len(null)), "ci": [float(plo), float(phi)],
                               "max_head": float(null.max()) / n}
    return WeightSummary(s, labels, columns, attrs)
