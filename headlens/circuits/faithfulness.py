"""How faithful a circuit is, as the field measures it: the metric with only the circuit left running.

Every measure runs the model with the heads outside the circuit ablated the way the edges were (the
setup's sender replacement: per-position mean, resample, zero, or the corrupted run; on IOI the aligned
mean over the ABC distribution), and the circuit's heads clean *at their positions only* (a node
``L9H9@END`` keeps its output at END; elsewhere it is ablated too). MLPs and the embedding stay clean.
With ``F(M)`` the clean metric, ``F(C)`` the circuit's and ``F(0)`` the metric with every head ablated:

* ``faithfulness``: the fraction of the clean-vs-ablated gap the circuit recovers,
  ``(F(C) - F(0)) / (F(M) - F(0))`` (1: the circuit alone does the task);
* ``ioi_faithfulness``: Wang et al. 2022 (§3, "faithfulness"), ``|F(M) - F(C)|`` in the metric's units
  (logit difference), with ``F(C) / F(M)`` (their GPT-2 circuit: 3.09 of 3.56, 87 %);
* ``mib``: Mueller et al. 2025 (MIB, §3.2): the faithfulness ``f(k)`` of the circuit made of the top
  ``k`` of the measured candidate edges (ranked by ``|effect|``), at ``k`` = 0.1 %, 0.2 %, 0.5 %, 1 %, 2 %,
  5 %, 10 %, 20 %, 50 %, 100 %; the **circuit performance ratio** ``CPR`` is the area under ``f`` (signed)
  and the **circuit-model difference** ``CMD`` the area under ``|1 - f|``, trapezoids over ``k`` on a
  linear axis from 0.1 % to 100 % (higher CPR, lower CMD is better). Two differences from MIB's own
  evaluation: MIB ablates the *edges* outside the circuit (each node reads a corrupted copy of what
  non-circuit edges send it), this ablates the *heads* outside it; and MIB's 100 % is the whole model's
  edge graph, here it is every edge discovery measured.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from headlens.interventions.logits import read_columns
from headlens.interventions.metrics import get_metric

MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
Nodes = set[tuple[str, str]]  # (head, position name or "all")


class Ablator:
    """The metric with only some heads (at some positions) clean: one forward with ``hook_z`` replaced."""

    def __init__(self, s: Any) -> None:
        self.s = s
        L, H = s.model.cfg.n_layers, s.model.cfg.n_heads
        self.L, self.H = L, H
        self.repl = [s.deltas._replaced(f"z{layer}") for layer in range(L)]  # (B, T, H, d_head) per layer
        self._cache: dict[frozenset, float] = {}

    def value(self, nodes: Iterable[tuple[str, str]]) -> float:
        """Mean metric with ``nodes`` (``(head name, position)``) clean and every other head ablated."""
        from headlens.interventions.sweep import task_logits

        nodes = frozenset(nodes)
        if nodes in self._cache:
            return self._cache[nodes]
        s = self.s
        B, T = s.task.tokens.shape
        keep = torch.zeros(self.L, B, T, self.H, dtype=torch.bool, device=s.task.tokens.device)
        for name, pos in nodes:
            if not name.startswith("L"):
                continue
            layer, head = (int(x) for x in name[1:].split("H"))
            mask = None if s.named is None or pos == "all" else s.named.mask(pos)
            keep[layer, :, :, head] |= True if mask is None else mask

        def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:  # (B, T, H, d_head)
            layer = int(hook.name.split(".")[1])
            return torch.where(keep[layer][..., None], z, self.repl[layer].to(z))

        hooks = [(f"blocks.{layer}.attn.hook_z", hook) for layer in range(self.L)]
        metric, at = get_metric(s.metric), s.task.at(read_columns(s.task.positions))  # unembed the read positions
        with torch.no_grad():
            clean = task_logits(s.model, s.task, cols=at.cols) if metric.needs_clean else None  # (B, C, V)
            with s.model.hooks(hooks):
                logits = task_logits(s.model, s.task, cols=at.cols)  # (B, C, V)
        self._cache[nodes] = float(metric(logits, at, clean).mean())
        return self._cache[nodes]

    def every_head(self) -> Nodes:
        return {(f"L{layer}H{h}", "all") for layer in range(self.L) for h in range(self.H)}


def edge_nodes(rows: Any) -> Nodes:
    """The nodes of edge-table rows: each head sender at its ``sender_pos``, each head receiver at its
    ``receiver_pos`` (``all`` without positions)."""
    out: Nodes = set()
    for r in rows.itertuples():
        for name, pos in ((r.sender, getattr(r, "sender_pos", "all")), (r.receiver, getattr(r, "receiver_pos", "all"))):
            if name.startswith("L"):
                out.add((name, pos))
    return out


def _recovered(a: Ablator, nodes: Nodes, m_clean: float, m_none: float) -> float:
    gap = m_clean - m_none
    return float((a.value(nodes) - m_none) / gap) if abs(gap) > 1e-12 else float("nan")


def area(ks: Sequence[float], fs: Sequence[float]) -> float:
    """Trapezoid area of ``fs`` over ``ks``.

    >>> area([0.0, 0.5, 1.0], [1.0, 1.0, 1.0])
    1.0
    """
    return float(sum((ks[i + 1] - ks[i]) * (fs[i] + fs[i + 1]) / 2 for i in range(len(ks) - 1)))


def measures(s: Any, circuit: Any, measured: Any, roots: Nodes, max_curve: int = 16) -> dict[str, Any]:
    """Every faithfulness figure of a discovered circuit (the edge-table rows ``circuit``; ``measured``: every
    candidate edge measured exactly; ``roots``: nodes that belong to it whatever its edges)."""
    a = Ablator(s)
    m_clean, m_none = a.value(a.every_head()), a.value(set())
    nodes = roots | edge_nodes(circuit)
    m_circ = a.value(nodes)
    out: dict[str, Any] = {"faithfulness": _recovered(a, nodes, m_clean, m_none),
                           "ioi_faithfulness": {"F_M": m_clean, "F_C": m_circ, "F_0": m_none,
                                                "abs_diff": abs(m_clean - m_circ),
                                                "ratio": m_circ / m_clean if abs(m_clean) > 1e-12 else float("nan")}}
    ranked = measured.sort_values("effect", key=abs, ascending=False, kind="stable") if len(measured) else measured
    fs = [_recovered(a, roots | edge_nodes(ranked.head(max(1, math.ceil(k * len(ranked))))), m_clean, m_none)
          for k in MIB_FRACTIONS] if len(ranked) else []
    out["mib"] = {"fractions": list(MIB_FRACTIONS), "faithfulness": fs, "n_edges": len(ranked),
                  "cpr": area(MIB_FRACTIONS, fs) if fs else float("nan"),
                  "cmd": area(MIB_FRACTIONS, [abs(1 - f) for f in fs]) if fs else float("nan")}
    n = len(circuit)
    steps = sorted({max(1, round(n ** (i / max(1, max_curve - 1)))) for i in range(max_curve)}) if n else []
    out["faithfulness_curve"] = [float(np.round(_recovered(a, roots | edge_nodes(circuit.head(k)), m_clean, m_none), 12))
                                 for k in steps]
    out["faithfulness_curve_n"] = steps
    return out


def describe(attrs: dict[str, Any]) -> list[str]:
    """Discovery's roles and faithfulness (its ``attrs``), one line each, for the CLI and the dashboard."""
    out = []
    if attrs.get("roles"):
        out.append("roles: " + "; ".join(f"{k} {v}" for k, v in attrs["roles"].items()))
    line = f"faithfulness (circuit heads clean, the rest ablated): {attrs['faithfulness']:.3f}"
    if "ioi_faithfulness" in attrs:
        ioi, mib = attrs["ioi_faithfulness"], attrs["mib"]
        line += (f"; F(M) {ioi['F_M']:.3f}, F(C) {ioi['F_C']:.3f}, |F(M) - F(C)| {ioi['abs_diff']:.3f} (IOI paper); "
                 f"MIB CPR {mib['cpr']:.3f}, CMD {mib['cmd']:.3f} over {mib['n_edges']} measured edges")
    return [*out, line]
