"""Discovery: the circuit for a metric, found from the heads that matter down through significant edges.

1. The heads that matter: ``sweep``'s single-head ablations (same method, same probe) whose effect beats
   random heads of their layer (in a one-head layer, which has none, whose CI clears the effect floor).
2. Recursively, every edge into those heads' q/k/v (from ``embed``, earlier heads and MLPs), measured
   exactly; significant edges (:func:`~headlens.circuits.edges.significant`) are kept, and their head
   senders are expanded in turn. Every reported edge is measured by exact patching; no gradient
   estimate is reported.
3. Faithfulness (:mod:`~headlens.circuits.faithfulness`): the metric with only the circuit's heads (its
   roots and every edge's heads) left clean (every other head ablated as the edges were) as the fraction of
   the clean-vs-all-ablated gap it recovers (1: the circuit alone does the task), the same with the roots
   and the heads of the top-n edges (``attrs["faithfulness_curve"]`` at ``attrs["faithfulness_curve_n"]``),
   the IOI paper's ``|F(M) - F(C)|`` and MIB's CPR and CMD.

With named positions and a metric read at one of them (IOI's logit_diff at END), discovery follows the
circuit through positions instead (:mod:`~headlens.circuits.positional`).

The same seed gives the same table: probes, controls, resampling and bootstraps are all seeded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from headlens.circuits.edges import EFFECT_FLOOR, effect_floor, significant_mask
from headlens.circuits.faithfulness import measures
from headlens.circuits.firstpass import FirstPass
from headlens.circuits.nodes import Node, make_edges
from headlens.interventions.metrics import get_metric
from headlens.interventions.sweep import sweep

MAX_DEPTH = 4


def heads_that_matter(s: Any) -> list[Node]:
    """Single heads whose ablation beats random heads of their layer on the metric (sweep) by more than
    the effect floor (:func:`~headlens.circuits.edges.effect_floor` of the clean metric)."""
    method = "mean" if s.deltas.method == "corrupted" else s.deltas.method
    df = sweep(s.model, method=method, metrics=[s.metric], prompts=s.prompts, n_prompts=s.task.n_prompts, n_control=s.n_control,
               control="layer", n_boot=s.n_boot, seed=s.seed, attribution=False,
               progress=lambda done, total: s.begin("discovery: ablating single heads", total, done))
    floor = np.array([effect_floor(c) for c in df.clean])
    worse = get_metric(s.metric).higher_is_worse
    harmful = (df.ci_low > floor) if worse else (df.ci_high < -floor)
    # a layer with one head has no other heads for a control (tracr's): then the CI alone must clear the floor
    hits = df[(df.beats_control | (df.control_delta.isna() & harmful)) & (df.delta.abs() >= floor)]
    return [Node("head", int(h[1:].split("H")[0]), int(h.split("H")[1])) for h in hits.heads]


def discover(s: Any, inputs: Sequence[str] = ("q", "k", "v"), senders: Sequence[Node] | None = None,
             first_pass: int | None = None) -> Any:
    """The discovered circuit's edge table (significant edges only), with faithfulness in ``attrs``.

    ``first_pass``: rank each round's candidate edges by edge attribution patching
    (:mod:`headlens.circuits.attribution`) and patch only the top ``first_pass`` exactly (with their
    controls); ``attrs["first_pass"]`` says how many were kept of how many and how well the estimates
    ranked the edges that were patched (Spearman). Where the estimate cannot run (``kl``; a bridge without
    per-head q/k/v forks) every candidate is patched and ``attrs["first_pass"]`` says why.
    """
    import pandas as pd

    from headlens.circuits.positional import discover_positions, read_position

    if s.named is not None and read_position(s) is not None:
        return discover_positions(s, inputs, senders, first_pass)
    roots = heads_that_matter(s)
    frontier, seen, tables = list(roots), set(roots), []
    ranked = FirstPass(s, first_pass)
    for depth in range(MAX_DEPTH):
        if not frontier:
            break
        what = f"discovery round {depth + 1} (at most {MAX_DEPTH}): "
        edges = ranked.keep(make_edges(s.model, sorted(frontier), senders, inputs, strict=False), what)
        df = s.table(edges, what=f"{what}patching {len(edges)} edges and their controls")
        ranked.compare(df)
        ranked.measured.append(df)
        keep = df[significant_mask(df)]
        tables.append(keep)
        frontier = []
        for name in keep.sender.unique():
            if name.startswith("L"):
                node = Node("head", int(name[1:].split("H")[0]), int(name.split("H")[1]))
                if node not in seen:
                    seen.add(node)
                    frontier.append(node)
    out = pd.concat(tables, ignore_index=True) if tables else s.table([])
    s.done_patching()  # faithfulness records its own runs
    out = out.sort_values("effect", key=abs, ascending=False, kind="stable").reset_index(drop=True)
    out.attrs.update(tables[0].attrs if tables else {})
    out.attrs["roots"] = [n.name for n in roots]
    if first_pass:
        out.attrs["first_pass"] = ranked.summary()
    out.attrs["verdict"] = "found" if len(out) else "inconclusive"
    if not len(out) and not roots:  # no evidence is no circuit: say so rather than report an empty "circuit"
        out.attrs["why"] = (f"no head's ablation moves {s.metric} beyond random heads of its layer by more than "
                            f"{EFFECT_FLOOR:g} of its clean value; the model shows no circuit for this metric "
                            f"(untrained weights, or a metric it does not do)")
    elif not len(out):
        out.attrs["why"] = (f"{', '.join(n.name for n in roots)} matter for {s.metric}, but no edge into their q, k "
                            f"or v beats its control by more than {EFFECT_FLOOR:g} of the clean value: what feeds "
                            f"them is spread over many senders, or arrives through MLPs, which are not receivers")
    if len(out):
        out.attrs.update(measures(s, out, pd.concat(ranked.measured, ignore_index=True), {(n.name, "all") for n in roots}))
    else:
        out.attrs.update(faithfulness_curve=[], faithfulness=float("nan"))
    return out
