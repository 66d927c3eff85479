"""The run-time check: every ``circuit`` run re-measures some of its own edges by path patching by freezing.

A family nobody has tested (a norm after the sublayer, a q/k norm over all heads, a logit scale) could
otherwise get a confident wrong circuit from the fast path. Before a table is returned or written, the
strongest edge (largest ``|effect|``) and one drawn at random (seeded) among the others are measured again by
:mod:`headlens.circuits.freezing` (the model's own forward, the sender's activation replaced, every other
component held clean; it never computes a write), prompt by prompt on the run's first ``N_PROMPTS`` prompts,
and the run stops with :class:`CheckError` (CLI exit 11) when any prompt's effects disagree beyond
``ATOL * max(1, |clean|) + RTOL * |reference|``. The result goes into the table's ``attrs["check"]``.
Cost, on ``N_PROMPTS`` prompts only: one clean forward plus two forwards per checked edge (one for a logits
edge); under a receiver-local metric every forward stops at the receivers' layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from headlens.circuits.nodes import CircuitError, Edge, Node, parse_node

ATOL = 1e-4  # float32 rounding of two different forwards, per unit of the metric's clean value
RTOL = 0.02  # a write rule that is wrong (a linear write under a post-norm) is off by far more
N_RANDOM = 1
N_PROMPTS = 4  # prompts each checked edge is re-measured on, one by one (the run's first ones)


class CheckError(CircuitError):
    """The fast path's edge disagrees with path patching by freezing: the write path does not fit this family."""

    exit_code = 11


def row_edge(model: Any, row: Any) -> Edge:
    """The edge of one edge-table row (discovery's rows: per query head, never per group)."""
    receiver = Node("logits") if row.receiver == "logits" else parse_node(row.receiver, model)
    return Edge(parse_node(row.sender, model), receiver, row.input, False, getattr(row, "receiver_pos", "all"),
                getattr(row, "sender_pos", "all"))


def picks(df: Any, seed: int, n_random: int = N_RANDOM) -> list[int]:
    """Row positions to check: the strongest edge, then ``n_random`` others drawn with ``seed``.

    >>> import pandas as pd
    >>> first, other = picks(pd.DataFrame({"effect": [0.1, -2.0, 0.3]}), seed=0)
    >>> first, other in (0, 2)
    (1, True)
    """
    if not len(df):
        return []
    effect = np.abs(df["effect"].to_numpy(dtype=float))
    first = int(np.nanargmax(effect)) if np.isfinite(effect).any() else 0
    rest = [i for i in range(len(df)) if i != first]
    rng = np.random.default_rng(seed)
    return [first, *(int(i) for i in rng.choice(rest, size=min(n_random, len(rest)), replace=False))]


def _freezer(s: Any, edges: list[Edge], n: int) -> Any:
    """The freezing reference on the run's first ``n`` prompts (its replacements sliced, not recomputed)."""
    from headlens.circuits.freezing import Freezer
    from headlens.circuits.local import is_receiver_metric

    rows = slice(0, n)
    local = is_receiver_metric(s.metric) and all(e.receiver.kind == "head" for e in edges)
    layers = sorted({e.receiver.layer for e in edges}) if local else []
    return Freezer(s.model, s.task.rows(rows), lambda node: s.deltas.replacement(node)[rows],
                   None if s.named is None else s.named.rows(rows), layers[-1] if layers else None, layers)


def run_check(s: Any, df: Any, edges: list[Edge] | None = None, n_prompts: int = N_PROMPTS) -> dict[str, Any]:
    """Re-measure :func:`picks` of ``df`` by freezing; record the result in ``df.attrs["check"]`` and return it.

    Each picked edge is compared prompt by prompt on the run's first ``n_prompts`` prompts (its per-prompt
    effects are kept by :meth:`~headlens.circuits.api.Setup.table` in ``s.measured``); an edge the run did not
    keep per prompt is compared by its mean over every prompt.

    Args:
        s: the run's :class:`~headlens.circuits.api.Setup` (model, task, sender replacements, positions).
        df: its edge table; ``edges``: the edges of its rows in order (None: read from the rows).

    Raises:
        CheckError: an edge's effect differs from the reference beyond the tolerance.
    """
    picked = [(i, edges[i] if edges is not None else row_edge(s.model, df.iloc[i])) for i in picks(df, s.seed)]
    clean = float(df.attrs.get("clean", float("nan")))
    atol = ATOL * (max(1.0, abs(clean)) if clean == clean else 1.0)
    n = min(n_prompts, len(s.task.tokens))
    out: dict[str, Any] = {"reference": "path patching by freezing", "atol": atol, "rtol": RTOL, "edges": []}
    if picked:  # an empty table (inconclusive) has nothing to check: no stage to show
        s.begin(f"run-time check: {len(picked)} edges measured again by path patching by freezing", len(picked))
    sub = _freezer(s, [e for _, e in picked], n) if picked else None
    for i, edge in picked:
        if edge in s.measured:  # prompt by prompt, on the first n
            fast, ref = np.asarray(s.measured[edge][:n], dtype=float), sub.effect(edge, s.metric)
        else:
            fast, ref = np.array([float(df.iloc[i].effect)]), np.array([float(np.mean(
                _freezer(s, [edge], len(s.task.tokens)).effect(edge, s.metric)))])
        ok = bool(np.all(np.abs(fast - ref) <= atol + RTOL * np.abs(ref)))
        out["edges"].append({"edge": edge.name, "effect": float(fast.mean()), "reference": float(ref.mean()),
                             "prompts": len(fast), "ok": ok})
        if s.progress is not None:
            s.progress(1)
        if not ok:
            df.attrs["check"] = {**out, "passed": False}
            worst = int(np.argmax(np.abs(fast - ref)))
            raise CheckError(
                f"run-time check failed: edge {edge.name} has effect {fast[worst]:+.4g} by the fast path but "
                f"{ref[worst]:+.4g} by path patching by freezing on prompt {worst} (tolerance {atol:.1g} + {RTOL:g} "
                f"x |reference|); headlens' write path does not fit this model's family, so no table is reported "
                f"(--no-check / check=False skips this check)")
    out["passed"] = True
    df.attrs["check"] = out
    return out
