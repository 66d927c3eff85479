"""Causal confirmation of head labels: does ablating a labelled head hurt its label's task
more than ablating random heads of the same layer does?

A pattern score says what a head looks at; the ablation says whether the model needs it
for the task the label names (docs/scores.md and docs/ablate.md):

| label | task metric |
|---|---|
| ``induction``, ``previous_token`` | ``repeated_loss`` (loss on the repeated half of ``BOS + r + r``) |
| ``bracket_matching``, ``open_bracket`` | ``bracket_accuracy`` (type of each closing bracket) |

Labels without a task metric get NaN. Backup heads and self-repair can hide a single head's
effect, so "not confirmed" means "no single-head effect beyond the control", not "wrong".
"""

from __future__ import annotations

from typing import Any

LABEL_METRICS = {
    "induction": "repeated_loss",
    "previous_token": "repeated_loss",
    "bracket_matching": "bracket_accuracy",
    "bracket_matching_hard": "bracket_accuracy",
    "open_bracket": "bracket_accuracy",
    "open_bracket_hard": "bracket_accuracy",
}

CONFIRM_COLUMNS = [
    "ablation_metric", "ablation_delta", "ablation_ci_low", "ablation_ci_high",
    "ablation_control_delta", "confirmed",
]


def _is_labelled(value: Any) -> bool:
    if value is None or value is False:
        return False
    if isinstance(value, float):
        return value == value and value != 0.0  # NaN and 0.0 mean "no label"
    return str(value).strip().lower() not in ("", "false", "0", "none", "nan")


def confirm(
    model: Any,
    table: Any,
    method: str = "mean",
    n_prompts: int = 32,
    n_control: int = 8,
    seed: int = 0,
    progress: Any = None,
) -> Any:
    """Add each labelled head's ablation effect on its label's metric and whether it beats the control.

    Args:
        model: the model the table describes (any backend).
        table: a classification table with columns ``layer, head, detector, label``; a row is
            labelled when ``label`` is truthy (True, or a non-empty string).
        method: ablation method (``mean`` by default: the head's average output over the probe).
        n_prompts: probe prompts per metric.
        n_control: random same-layer control heads per labelled head.
        seed: seeds probes, controls and bootstrap.
        progress: passed to :func:`headlens.interventions.sweep.sweep`.

    Returns:
        A copy of ``table`` with ``CONFIRM_COLUMNS`` added (NaN / False for rows that are not
        labelled or whose detector has no task metric).
    """
    import numpy as np

    from headlens.interventions.sweep import sweep

    missing = {"layer", "head", "detector", "label"} - set(table.columns)
    if missing:
        from headlens.errors import HeadlensError

        raise HeadlensError(f"confirm needs a classification table with columns {sorted(missing)}")
    out = table.copy()
    metric_of = [
        LABEL_METRICS.get(str(d)) if _is_labelled(lab) else None
        for d, lab in zip(out["detector"], out["label"], strict=True)
    ]
    out["ablation_metric"] = metric_of
    for col in CONFIRM_COLUMNS[1:-1]:
        out[col] = np.nan
    out["confirmed"] = False
    for metric in sorted({m for m in metric_of if m is not None}):
        rows = [i for i, m in enumerate(metric_of) if m == metric]
        heads = sorted({(int(out["layer"].iat[i]), int(out["head"].iat[i])) for i in rows})
        res = sweep(model, groups=[[h] for h in heads], method=method, metrics=[metric], n_prompts=n_prompts,
                    n_control=n_control, seed=seed, attribution=False, progress=progress)
        by_head = {h: r for h, (_, r) in zip(heads, res.iterrows(), strict=True)}
        for i in rows:
            r = by_head[(int(out["layer"].iat[i]), int(out["head"].iat[i]))]
            for col, src in zip(CONFIRM_COLUMNS[1:], ("delta", "ci_low", "ci_high", "control_delta", "beats_control"),
                                strict=True):
                out.iloc[i, out.columns.get_loc(col)] = r[src]
    out["confirmed"] = out["confirmed"].astype(bool)
    return out
