"""Resting on the first token: the ``rest`` column of the scores table.

Why it looks like this:

* **Resting is a state, not a type.** In a trained LM most heads put most of their attention on the
  first token when they have nothing to do (Xiao et al. 2023, StreamingLLM; Gu et al. 2024, "When
  Attention Sink Emerges"): on SmolLM2-135M half of the 270 heads pass the label rule for it, among
  them its best induction head. Listed as a type, it drowns the types that say what a head does; so
  every row carries the head's resting mass instead, and the label rule orders resting labels last
  (:func:`headlens.scoring.primary.label_order`).
* **Measured on the row's own probe.** A head rests differently on random tokens, on repeats and on
  prose; the induction row's ``rest`` is read from the same forward passes as its induction score.
* **Free where the scan already runs.** ``first_token``'s targets (key 0 for every row q >= 1) are one
  more index detector in a scan that reads the pattern anyway: one gather per layer, no extra forward.
  A probe read by the top-1 engine alone (needle prompts for ``retrieval``) would need a mass scan of
  its own, so its rows say NaN; weight scores (no probe) say NaN too.
* **A point estimate.** ``rest`` describes the head beside its score; its label, with a CI, is the
  ``first_token`` row's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from headlens.detectors import first_token
from headlens.detectors.base import Detector
from headlens.scoring.engine import DetectorStats

REST = first_token.DETECTOR  # T(q) = {0} for q >= 1: the first token (BOS when the tokenizer adds one)


def with_rest(run: Sequence[Detector]) -> list[Detector]:
    """The detectors a probe's scan runs, with :data:`REST` added when a mass detector reads the pattern."""
    run = list(run)
    if any(d.name == REST.name for d in run) or not any(d.kind in ("index", "mask") for d in run):
        return run
    return [*run, REST]


def rest_of(stats: dict[str, DetectorStats], served: Sequence[Detector]) -> torch.Tensor | None:
    """``(L*H,)`` float64 resting mass per head from a scan run with :func:`with_rest`; the stats of
    :data:`REST` are removed from ``stats`` unless the user asked for ``first_token`` itself (``served``).
    None when the scan did not measure it."""
    st = stats.get(REST.name) if any(d.name == REST.name for d in served) else stats.pop(REST.name, None)
    if st is None or float(st.counts.sum()) == 0:
        return None
    P, L, H = st.sums.shape
    return st.sums.reshape(P, L * H).sum(0) / st.counts.sum()  # pooled over prompts, like a score
