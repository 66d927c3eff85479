"""Discovery's optional gradient first pass: rank each round's candidate edges by edge attribution patching
(:mod:`~headlens.circuits.attribution`) and keep the top ones for exact patching; report how well it ranked."""

from __future__ import annotations

from typing import Any

import numpy as np

from headlens.models.memory import release_freed


class FirstPass:
    """Discovery's optional gradient first pass: which candidates get patched exactly, and how well it ranked."""

    def __init__(self, s: Any, top: int | None) -> None:
        from headlens.circuits.attribution import supported

        self.s, self.top = s, top
        self.why = supported(s.model, s.metric) if top else "off"
        self.kept = self.candidates = 0
        self.estimates: dict[tuple[str, ...], float] = {}  # (sender, receiver, input, positions) -> estimate
        self.pairs: list[tuple[float, float]] = []
        self.measured: list[Any] = []  # every candidate edge table measured exactly (for the MIB curve)

    def keep(self, edges: list[Any], what: str = "") -> list[Any]:
        """The candidates ``edges`` to patch exactly: the top ones by their estimate (all where the first pass is
        off or cannot run). ``what``: the stage's name before the first pass's own, for the progress display."""
        self.candidates += len(edges)
        if self.why is not None or len(edges) <= self.top:
            self.kept += len(edges)
            return edges
        from headlens.circuits.attribution import edge_attribution

        s = self.s
        s.begin(f"{what}ranking {len(edges):,} candidate edges by gradient (first pass; prompts done)", s.task.n_prompts)
        est = {e: float(v.mean()) for e, v in edge_attribution(s.model, s.task, s.metric, edges, s.deltas,
                                                                named=s.named, record=s.recorded_run(),
                                                                progress=s.progress).items()}
        release_freed()  # the backward passes' freed heap (0.7 GB on SmolLM2's IOI), before the exact rounds
        if not any(est.values()):  # an estimate of zero everywhere ranks nothing: patch them all, and say so
            self.why = "every estimate is zero (the metric's gradient vanishes at the clean run)"
            self.kept += len(edges)
            return edges
        self.estimates.update({(e.sender.name, e.receiver.name, e.input, e.pos, e.sender_pos): v for e, v in est.items()})
        best = set(sorted(edges, key=lambda e: -abs(est[e]))[: self.top])
        self.kept += len(best)
        return [e for e in edges if e in best]  # in the forward's order, as without the first pass

    def compare(self, df: Any) -> None:
        self.pairs += [(self.estimates[k], row.effect) for row in df.itertuples()
                       if (k := (row.sender, row.receiver, row.input, row.receiver_pos, row.sender_pos)) in self.estimates]

    def summary(self) -> dict[str, Any]:
        from headlens.interventions.attribution import spearman

        out: dict[str, Any] = {"kept": self.kept, "candidates": self.candidates}
        if self.why is not None:
            out["skipped"] = self.why
        elif self.pairs:
            a, b = zip(*self.pairs, strict=True)
            out["spearman"] = spearman(np.array(a), np.array(b))
        return out


