"""The strongest writers and suppressors of a target: the attribution table summarised over prompts.

:func:`headlens.attribute` gives one row per component x prompt x position; a reader wants one row per
component with its mean over prompts and a 95 % bootstrap CI that resamples *prompts* (positions of one
prompt are averaged first: they are not independent), the same percentile bootstrap as the scores table
(:func:`headlens.scoring.stats.summarize`). ``share`` is the mean attribution over the mean total (the
logit or logit difference the parts sum to), so the components' shares sum to 1.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from headlens.scoring.stats import N_BOOT
from headlens.scoring.stats import summarize as pooled

SUMMARY_COLUMNS = ("model", "component", "layer", "head", "target", "attribution", "ci_low", "ci_high", "share",
                   "n_prompts")
_HEAD = re.compile(r"^L(\d+)H(\d+)$")
_MLP = re.compile(r"^mlp(\d+)$")


def attribution_summary(table: Any, n_boot: int = N_BOOT, seed: int = 0) -> Any:
    """One row per component: mean attribution over prompts with a bootstrap CI, strongest writer first.

    Args:
        table: an attribution table (:func:`headlens.attribute`).
        n_boot: bootstrap resamples.
        seed: bootstrap seed.

    Returns:
        A DataFrame with :data:`SUMMARY_COLUMNS` sorted by ``attribution`` (descending): writers first,
        suppressors last. ``layer`` / ``head`` are -1 where they do not apply (``embed``, ``bias``; an MLP
        has its layer and head -1). ``attrs["total"]`` holds the mean total and its CI.

    >>> import pandas as pd
    >>> t = pd.DataFrame({"model": "m", "component": ["L0H0", "bias"] * 2, "prompt": [0, 0, 1, 1],
    ...                   "position": 3, "target": "' x'", "attribution": [1.0, 0.5, 3.0, 0.5]})
    >>> attribution_summary(t, n_boot=10)[["component", "attribution", "share"]].values.tolist()
    [['L0H0', 2.0, 0.8], ['bias', 0.5, 0.2]]
    """
    import pandas as pd

    per_prompt = table.groupby(["prompt", "component"], sort=False).attribution.mean().unstack()  # (P, C)
    order = list(dict.fromkeys(table.component))
    per_prompt = per_prompt[order]
    values = torch.tensor(per_prompt.to_numpy(), dtype=torch.float64)  # (P, C)
    ones = torch.ones(values.shape[0], dtype=torch.float64)
    s = pooled(values, ones, torch.zeros_like(ones), seed=seed, n_boot=n_boot)
    total = pooled(values.sum(1, keepdim=True), ones, torch.zeros_like(ones), seed=seed, n_boot=n_boot)
    mean_total = float(total.score[0])
    targets = table.target.unique()
    target = str(targets[0]) if len(targets) == 1 else "each prompt's top prediction"
    rows = [{"model": str(table.model.iloc[0]), "component": c, **_layer_head(c), "target": target,
             "attribution": float(s.score[i]), "ci_low": float(s.ci_low[i]), "ci_high": float(s.ci_high[i]),
             "share": float(s.score[i]) / mean_total if mean_total else float("nan"), "n_prompts": s.n_prompts}
            for i, c in enumerate(order)]
    out = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS)).sort_values("attribution", ascending=False,
                                                                          ignore_index=True)
    out.attrs.update({**table.attrs, "total": {"mean": mean_total, "ci_low": float(total.ci_low[0]),
                                               "ci_high": float(total.ci_high[0])},
                      "n_boot": n_boot, "seed": seed})
    return out


def _layer_head(component: str) -> dict[str, int]:
    if m := _HEAD.match(component):
        return {"layer": int(m.group(1)), "head": int(m.group(2))}
    if m := _MLP.match(component):
        return {"layer": int(m.group(1)), "head": -1}
    return {"layer": -1, "head": -1}


def strongest(summary: Any, k: int = 10, heads_only: bool = False) -> tuple[Any, Any]:
    """The ``k`` strongest writers (largest positive mean) and suppressors (most negative) of a summary,
    the ``bias`` term left out (it is no component of the network's computation)."""
    rows = summary[summary.component != "bias"]
    if heads_only:
        rows = rows[rows["head"] >= 0]
    writers = rows[rows.attribution > 0].head(k)
    suppressors = rows[rows.attribution < 0].sort_values("attribution").head(k)
    return writers, suppressors
