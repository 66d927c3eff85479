"""The run-time check: every ``circuit`` run re-measures some of its own edges by path patching by freezing.

A family nobody has tested (a norm after the sublayer, a q/k norm over all heads, a logit scale) could
otherwise get a confident wrong circuit from the fast path. Before a table is returned or written, the
strongest edge (largest ``|effect|``) and one drawn at random (seeded) among the others are measured again by
:mod:`headlens.circuits.freezing` (the model's own forward, the sender's activation replaced, every other
component held clean; it never computes a write), and the run stops with :class:`CheckError` (CLI exit 10)
when they disagree beyond ``ATOL * max(1, |clean|) + RTOL * |reference|``. The result goes into the table's
``attrs["check"]``. Cost: one clean forward plus two forwards per checked edge (one for a logits edge).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from headlens.circuits.nodes import CircuitError, Edge, Node, parse_node

ATOL = 1e-4  # float32 rounding of two different forwards, per unit of the metric's clean value
RTOL = 0.02  # a write rule that is wrong (a linear write under a post-norm) is off by far more
N_RANDOM = 1


class CheckError(CircuitError):
    """The fast path's edge disagrees with path patching by freezing: the write path does not fit this family."""

    exit_code = 10


def row_edge(model: Any, row: Any) -> Edge:
    """The edge of one edge-table row (discovery's rows: per query head, never per group)."""
    receiver = Node("logits") if row.receiver == "logits" else parse_node(row.receiver, model)
    return Edge(parse_node(row.sender, model), receiver, row.input, False, getattr(row, "receiver_pos", "all"),
                getattr(row, "sender_pos", "all"))


def picks(df: Any, seed: int, n_random: int = N_RANDOM) -> list[int]:
    """Row positions to check: the strongest edge, then ``n_random`` others drawn with ``seed``."""
    if not len(df):
        return []
    effect = np.abs(df["effect"].to_numpy(dtype=float))
    first = int(np.nanargmax(effect)) if np.isfinite(effect).any() else 0
    rest = [i for i in range(len(df)) if i != first]
    rng = np.random.default_rng(seed)
    return [first, *(int(i) for i in rng.choice(rest, size=min(n_random, len(rest)), replace=False))]


def run_check(s: Any, df: Any, edges: list[Edge] | None = None) -> dict[str, Any]:
    """Re-measure :func:`picks` of ``df`` by freezing; record the result in ``df.attrs["check"]`` and return it.

    Args:
        s: the run's :class:`~headlens.circuits.api.Setup` (model, task, sender replacements, positions).
        df: its edge table; ``edges``: the edges of its rows in order (None: read from the rows).

    Raises:
        CheckError: an edge's effect differs from the reference beyond the tolerance.
    """
    from headlens.circuits.freezing import Freezer

    rows = picks(df, s.seed)
    clean = float(df.attrs.get("clean", float("nan")))
    scale = max(1.0, abs(clean)) if clean == clean else 1.0
    out: dict[str, Any] = {"reference": "path patching by freezing", "atol": ATOL * scale, "rtol": RTOL, "edges": []}
    freezer = Freezer(s.model, s.task, s.deltas.replacement, s.named) if rows else None
    for i in rows:
        row = df.iloc[i]
        edge = edges[i] if edges is not None else row_edge(s.model, row)
        ref = float(np.mean(freezer.effect(edge, s.metric)))
        fast = float(row.effect)
        ok = abs(fast - ref) <= ATOL * scale + RTOL * abs(ref)
        out["edges"].append({"edge": edge.name, "effect": fast, "reference": ref, "ok": bool(ok)})
        if not ok:
            df.attrs["check"] = {**out, "passed": False}
            raise CheckError(
                f"run-time check failed: edge {edge.name} has effect {fast:+.4g} by the fast path but {ref:+.4g} by "
                f"path patching by freezing (tolerance {ATOL * scale:.1g} + {RTOL:g} x |reference|); headlens' write "
                f"path does not fit this model's family, so no table is reported (--no-check / check=False skips this check)")
    out["passed"] = True
    df.attrs["check"] = out
    return out
