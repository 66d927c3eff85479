"""Causal confirmation of head labels: does ablating a type's strongest heads move the metric that type
should move more than ablating as many random heads of the same layers does?

A pattern score says what a head looks at; the ablation says whether the model needs it for the task the
label names (docs/scores.md and docs/ablate.md):

| label | task metric | why this one |
|---|---|---|
| ``induction``, ``previous_token``, ``duplicate_token``, ``ov_copying`` | ``repeated_loss`` | the second copy of ``BOS + r + r`` is predicted by the induction circuit: previous-token heads feed it, induction heads read the earlier copy, ov_copying heads write the attended token, duplicate-token heads mark the repeat |
| ``bracket_matching``, ``open_bracket`` (and ``_hard``) | ``bracket_accuracy`` | the type of each closing bracket |
| ``retrieval`` | ``needle_recall`` | the needle copied out of a haystack (Wu et al. 2024) |
| ``ov_suppression`` | ``repeated_loss`` | a head whose OV writes against the token it attends to would, if it suppressed copies, push down the repeat of ``BOS + r + r``: ablating it should *lower* the loss |
| ``name_mover``, ``negative_name_mover``, ``copy_suppression`` | ``logit_diff`` | IO over S at the end of IOI prompts (Wang et al. 2022); a negative name mover (and a copy suppression head, one of them) writes against it, so ablating it should *raise* it |
| every other type (``current_token``, ``coreference``, resting ``first_token`` / ``sink``, your own) | ``lm_loss`` | generic: the next-token loss on real text (prose for a subword tokenizer). A weak test: no type-specific task |

**One group per type.** The type's strongest labelled heads (``top``, by its primary statistic: the
heads :func:`headlens.scoring.summary.type_summaries` lists; for a resting type the heads that do
nothing else) are ablated together, beside ``n_control`` random groups with as many heads in each of the
same layers (all heads of the model when a group fills its layers). Together, because a real LM backs its
heads up: one induction head of several can be taken out at little cost (IOI 2022's backup heads). A label
is *confirmed* when the excess over the control is clear (its 95 % CI excludes zero, the harmful way).

It says nothing about one head on its own (one head that rides along in a group that is confirmed is not
vouched for): ``headlens ablate --heads LxHy`` measures a head alone, ``top=1`` tests each type's best head.
"Not confirmed" means "no effect of these heads together beyond the control", not "wrong"; a metric this
model cannot run (a bidirectional model, one without logits) leaves the type untested (NaN), never passed.

Cost: ``1 + n_control`` ablated forward passes of ``n_prompts`` prompts per type, plus a clean and a
reference pass per metric (on SmolLM2-135M with the defaults: 7 types, 39 passes of 16 x 64 tokens).
"""

from __future__ import annotations

from typing import Any

LABEL_METRICS = {
    "induction": "repeated_loss",
    "previous_token": "repeated_loss",
    "duplicate_token": "repeated_loss",
    "ov_copying": "repeated_loss",
    "bracket_matching": "bracket_accuracy",
    "bracket_matching_hard": "bracket_accuracy",
    "open_bracket": "bracket_accuracy",
    "open_bracket_hard": "bracket_accuracy",
    "retrieval": "needle_recall",
    "name_mover": "logit_diff",
    "negative_name_mover": "logit_diff",
    "copy_suppression": "logit_diff",
    "ov_suppression": "repeated_loss",
}
# heads that work against their task: ablating them should help it
AGAINST = frozenset({"negative_name_mover", "copy_suppression", "ov_suppression"})
GENERIC_METRIC = "lm_loss"  # for the types without a task of their own

CONFIRM_COLUMNS = [
    "ablation_metric", "ablation_delta", "ablation_ci_low", "ablation_ci_high",
    "ablation_control_delta", "confirmed", "ablation_heads",
]
TOP = 3  # heads per type ablated together


def metric_for(detector: str) -> str:
    """The task metric a type's ablation is judged on (the module docstring's table).

    >>> metric_for("induction"), metric_for("streaming(w=128)"), metric_for("first_token")
    ('repeated_loss', 'lm_loss', 'lm_loss')
    """
    return LABEL_METRICS.get(str(detector).split("(")[0], GENERIC_METRIC)


def confirm(
    model: Any,
    table: Any,
    method: str = "mean",
    n_prompts: int = 16,
    n_control: int = 4,
    seed: int = 0,
    progress: Any = None,
    top: int = TOP,
    seq_len: int = 64,
) -> Any:
    """Ablate each labelled type's strongest heads together against random heads of the same layers.

    Args:
        model: the model the table describes (any backend).
        table: a classification table (``headlens.classify``; at least ``layer, head, detector, label,
            score`` and, for the ranking, ``lift``).
        method: ablation method (``mean`` by default: the head's average output over the probe).
        n_prompts: probe prompts per metric.
        n_control: random control groups per type (same number of heads in each of the same layers).
        seed: seeds probes, controls and bootstrap.
        progress: passed to :func:`headlens.interventions.sweep.sweep` (``fn(done, total)``), per metric.
        top: heads per type ablated together (1: each type's best head alone).
        seq_len: tokens per probe prompt.

    Returns:
        A copy of ``table`` with ``CONFIRM_COLUMNS`` added: the rows of the heads tested for their type
        carry the group's effect (``ablation_heads`` names the group); other rows NaN / False. The
        per-type results are in ``attrs["confirmation"]`` (one dict per type: detector, heads, metric,
        method, clean, delta, ci_low, ci_high, control_delta, excess_ci_low, excess_ci_high, confirmed,
        and ``error`` where the metric cannot run on this model).
    """
    import numpy as np

    from headlens.errors import HeadlensError
    from headlens.scoring.summary import type_summaries

    missing = {"layer", "head", "detector", "label", "score"} - set(table.columns)
    if missing:
        raise HeadlensError(f"confirm needs a classification table with columns {sorted(missing)}")
    out = table.copy()
    out.attrs.update(table.attrs)
    for col, fill in zip(CONFIRM_COLUMNS, (None, np.nan, np.nan, np.nan, np.nan, False, None), strict=True):
        out[col] = fill
    summary = table.assign(**{c: table[c] if c in table else np.nan for c in ("lift", "n_positions")})
    groups = [(t.detector, [(int(r.layer), int(r.head)) for r in t.heads.itertuples()])
              for t in type_summaries(summary, top) if t.n_labelled and not t.heads.empty]
    results = []
    for metric in dict.fromkeys(metric_for(d) for d, _ in groups):
        mine = [(d, heads) for d, heads in groups if metric_for(d) == metric]
        results += _measure(model, mine, metric, method, n_prompts, n_control, seed, progress, seq_len)
    for res in results:
        tested = np.array([(int(a), int(b)) in set(res["pairs"]) for a, b in zip(out["layer"], out["head"], strict=True)])
        rows = (out["detector"] == res["detector"]).to_numpy() & tested
        for col, key in zip(CONFIRM_COLUMNS, ("metric", "delta", "ci_low", "ci_high", "control_delta", "confirmed",
                                              "heads"), strict=True):
            out.loc[rows, col] = res[key]
    out["confirmed"] = out["confirmed"].astype(bool)
    out.attrs["confirmation"] = [{k: v for k, v in r.items() if k != "pairs"} for r in results]
    out.attrs["confirmation_settings"] = {"method": method, "n_prompts": n_prompts, "n_control": n_control,
                                          "top": top, "seq_len": seq_len, "seed": seed, "control": "auto"}
    return out


def _measure(model: Any, groups: list[tuple[str, list[tuple[int, int]]]], metric: str, method: str, n_prompts: int,
             n_control: int, seed: int, progress: Any, seq_len: int) -> list[dict[str, Any]]:
    """One sweep of every type group judged on ``metric``; a metric the model cannot run: NaN and why."""
    from headlens.errors import HeadlensError
    from headlens.interventions.ablation import format_heads
    from headlens.interventions.metrics import get_metric
    from headlens.interventions.sweep import sweep

    nan = float("nan")
    base = [{"detector": d, "pairs": heads, "heads": format_heads(heads), "metric": metric, "method": method}
            for d, heads in groups]
    try:
        res = sweep(model, groups=[heads for _, heads in groups], method=method, metrics=[metric], n_prompts=n_prompts,
                    n_control=n_control, control="auto", seed=seed, attribution=False, progress=progress,
                    seq_len=seq_len)
    except HeadlensError as err:  # e.g. a bidirectional model has no next-token loss: untested, not passed
        return [{**b, "clean": nan, "delta": nan, "ci_low": nan, "ci_high": nan, "control_delta": nan,
                 "excess_ci_low": nan, "excess_ci_high": nan, "confirmed": False, "error": str(err)} for b in base]
    keys = ("clean", "delta", "ci_low", "ci_high", "control_delta", "excess_ci_low", "excess_ci_high")
    helps = get_metric(metric).higher_is_worse  # for AGAINST types: ablating them should move it the good way
    return [{**b, **{k: float(r[k]) for k in keys}, "control": r["control"], "error": "",
             "confirmed": _helps(r, helps) if b["detector"] in AGAINST else bool(r["beats_control"])}
            for b, (_, r) in zip(base, res.iterrows(), strict=True)]


def _helps(r: Any, higher_is_worse: bool) -> bool:
    """An against-the-task type is confirmed when ablating its heads helps the task, its own CI on the good side
    of zero, *and* helps beyond the random groups: a control that hits the task's own heads (the induction
    head among layer 1's four) makes the excess large without the type doing anything."""
    if higher_is_worse:
        return bool(r["ci_high"] < 0 and r["excess_ci_high"] < 0)
    return bool(r["ci_low"] > 0 and r["excess_ci_low"] > 0)
