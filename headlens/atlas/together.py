"""The descriptions put back together: the whole-model line of the substitution test
(:mod:`headlens.atlas.substitute`), the best-described fractions of the heads and each layer's line, as one
result with its table (``substitution.csv``) and its sentence (the CLI's last line, the atlas index).

Why it looks like this: the whole-model line mixes two things, the descriptions' own errors and what the model
loses because a head put back on its description attends by the tokens alone and can no longer correct an
earlier head's error; the best-described fractions set it beside tests that replace a part of a model's heads,
and, when every layer's line is exact, the layers' lines added up say how much of it is their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Substitution:
    """The whole-model line: clean loss, the loss with every described head substituted (``all_heads``, with
    its bootstrap interval ``all_ci``) and per layer (layer -> (heads substituted, loss)), on ``windows``;
    ``per_layer_mean``: layer -> the loss with the same heads mean-ablated at once instead (what the layer's
    substitution is measured against); ``layer_how``: layer -> ``"exact"`` or ``"estimated"`` (the sum of its
    heads' first-order estimates; ``how`` is ``"exact"`` when every layer's line is); ``best``: ``(fraction,
    heads, loss)``, the best-described ``fraction`` of the described heads (by held-out agreement) substituted
    at once (:data:`headlens.atlas.substitute.BEST`), to set the whole-model line beside tests that replace a part of a model's heads."""

    clean: float
    all_heads: float
    all_ci: tuple[float, float]
    n_heads: int
    windows: int
    per_layer: dict[int, tuple[int, float]] = field(default_factory=dict)
    per_layer_mean: dict[int, float] = field(default_factory=dict)
    how: str = "exact"  # the per-layer lines: "exact" when all are, else "estimated" (some or all: layer_how)
    exact_heads: int = 0  # heads whose share kept was run exactly
    layer_how: dict[int, str] = field(default_factory=dict)  # layer -> "exact" or "estimated" (default: how)
    best: list[tuple[float, int, float]] = field(default_factory=list)  # (fraction, heads, loss), best first

    def __setstate__(self, state: dict[str, Any]) -> None:  # a pickle from before ``layer_how`` and ``best``
        self.__dict__.update({"layer_how": {}, "best": [], **state})

    def layers_alone(self) -> float | None:
        """The per-layer lines' changes summed (each layer's described heads substituted with every other head
        real), when every line is exact; against :attr:`all_heads` it shows how much of the whole is the
        layers' errors compounding through later heads rather than their own. None where a line is estimated."""
        if not self.per_layer or any(self.layer_how.get(la, self.how) != "exact" for la in self.per_layer):
            return None
        return sum(v - self.clean for _, v in self.per_layer.values())

    def sentence(self) -> str:
        """The whole-model line in words, with the best-described fractions and, when every layer's line is exact,
        what the layers cost alone (the CLI's summary and the atlas index say it)."""
        pct = lambda v: f"{100 * (v - self.clean) / self.clean:+.1f} %"  # noqa: E731
        words = {0.25: "quarter", 0.5: "half", 0.75: "three quarters"}
        out = (f"all {self.n_heads} described heads substituted at once: loss {self.all_heads:.3f} against "
               f"{self.clean:.3f} clean ({pct(self.all_heads)}, {self.windows} held-out windows)")
        if self.best:
            out += "; the best-described " + ", ".join(f"{words.get(f, f'{f:.0%}')} ({n} heads) {pct(v)}"
                                                      for f, n, v in self.best)
        alone = self.layers_alone()
        if alone is not None:
            out += (f"; each layer's heads put back alone add up to {100 * alone / self.clean:+.1f} %: the rest is "
                    "their errors compounding through later heads, which no longer adapt their attention")
        return out

    def frame(self, model: str) -> Any:
        """One row for the whole model, one per best-described fraction (``scope`` ``best``), then one per
        layer: ``model, scope, layer, heads, fraction, clean_loss, loss, change, change_pct, mean_ablated_loss,
        windows, how`` (``fraction``: of the described heads, 1 for ``all``, empty per layer;
        ``mean_ablated_loss``: the same heads mean-ablated at once, per layer only; ``how``: ``exact``, or
        ``estimated`` for layer lines from first-order estimates)."""
        import pandas as pd

        nan = float("nan")
        rows = ([("all", -1, self.n_heads, 1.0, self.all_heads)] + [("best", -1, n, f, v) for f, n, v in self.best]
                + [("layer", la, n, nan, v) for la, (n, v) in sorted(self.per_layer.items())])
        return pd.DataFrame([{"model": model, "scope": s, "layer": la, "heads": n, "fraction": f,
                              "clean_loss": self.clean, "loss": v, "change": v - self.clean,
                              "change_pct": 100 * (v - self.clean) / self.clean,
                              "mean_ablated_loss": self.per_layer_mean.get(la, nan) if s == "layer" else nan,
                              "windows": self.windows,
                              "how": self.layer_how.get(la, self.how) if s == "layer" else "exact"}
                             for s, la, n, f, v in rows])
