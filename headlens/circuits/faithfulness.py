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

Why it looks like this:

* **One ablated forward, then only what each node set changes.** On a bridged Hugging Face model with the
  resumed path (:mod:`~headlens.circuits.resume`) the every-head-ablated forward is recorded once (what each
  block was called with, its keys and values as attention scores them). A node set's run equals it in every
  layer before its earliest clean head and, the model being causal, at every position before each prompt's
  earliest node position; so the set runs only the blocks from that layer on, at the positions from that one
  to each prompt's end (a node at ``all``: every position), attention reading the recorded keys and values
  elsewhere, and unembeds only the read positions (for ``logit_diff``, only the two answers).
* **A growing circuit resumes from the one before.** The same holds between any two node sets, and the curve's
  and MIB's circuits grow: each set resumes from the earlier run whose heads first differ from its own
  latest (:func:`plan`: fewest blocks x positions), a run kept only while a later set needs it.
* One whole hooked forward per set stays the reference (``Ablator(s, resume=False)``) and the path of every
  other model; the two agree within float rounding.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from headlens.circuits.engine import LOGIT_BUDGET, answer_columns
from headlens.circuits.recorded import _at, resumable
from headlens.circuits.resume import ResumePatcher
from headlens.interventions.logits import read_columns
from headlens.interventions.metrics import get_metric

MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
Nodes = set[tuple[str, str]]  # (head, position name or "all")


class Ablator:
    """The metric with only some heads (at some positions) clean (see the module docstring).

    ``resume``: on a resumable bridged model, record the every-head-ablated forward once and resume each node set
    from it or from a smaller set's run (None: when the setup is ``fast``); False: one whole hooked forward per
    node set, the reference.
    """

    def __init__(self, s: Any, resume: bool | None = None) -> None:
        self.s = s
        L, H = s.model.cfg.n_layers, s.model.cfg.n_heads
        self.L, self.H = L, H
        self.repl = [s.deltas._replaced(f"z{layer}") for layer in range(L)]  # (B, T, H, d_head) per layer
        self.metric, self.at = get_metric(s.metric), s.task.at(read_columns(s.task.positions))  # the read positions
        self.resume = bool(s.fast if resume is None else resume) and resumable(s.model)
        self._cache: dict[frozenset, float] = {}

    def value(self, nodes: Iterable[tuple[str, str]]) -> float:
        """Mean metric with ``nodes`` (``(head name, position)``) clean and every other head ablated."""
        return self.values([nodes])[0]

    def values(self, sets: Sequence[Iterable[tuple[str, str]]]) -> list[float]:
        """:meth:`value` of each node set, the resumed ones run together."""
        keys = [frozenset(n) for n in sets]
        todo = [n for n in dict.fromkeys(keys) if n not in self._cache]
        if todo:
            B = self.s.task.tokens.shape[0]
            self.s.begin(f"faithfulness: the model run with only each of {len(todo)} circuits' heads ({B} prompts each)", len(todo) * B)
            if self.resume:
                per = max(1, LOGIT_BUDGET // (4 * self.s.task.tokens.shape[1] * self.s.model.cfg.d_vocab))
                parts = [self._resumed(todo, slice(i, i + per)) for i in range(0, B, per)]  # [set][prompt]
                found = [torch.cat([p[k] for p in parts]) for k in range(len(todo))]
            else:
                found = [self._forward(n) for n in todo]
            self._cache.update({n: float(v.mean()) for n, v in zip(todo, found, strict=True)})
        return [self._cache[n] for n in keys]

    def _keep(self, nodes: frozenset, named: Any, B: int, T: int) -> torch.Tensor:
        """``(L, B, T, H)`` bool: where each head's ``hook_z`` stays clean."""
        keep = torch.zeros(self.L, B, T, self.H, dtype=torch.bool, device=self.s.task.tokens.device)
        for name, pos in nodes:
            if not name.startswith("L"):
                continue
            layer, head = (int(x) for x in name[1:].split("H"))
            mask = None if named is None or pos == "all" else named.mask(pos)
            keep[layer, :, :, head] |= True if mask is None else mask
        return keep

    def _forward(self, nodes: frozenset) -> torch.Tensor:
        """``(B,)`` per-prompt metric of one whole hooked forward over the prompts (the reference)."""
        from headlens.interventions.sweep import task_logits

        s = self.s
        keep = self._keep(nodes, s.named, *s.task.tokens.shape)

        def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:  # (B, T, H, d_head)
            layer = int(hook.name.split(".")[1])
            return torch.where(keep[layer][..., None], z, self.repl[layer].to(z))

        hooks = [(f"blocks.{layer}.attn.hook_z", hook) for layer in range(self.L)]
        with torch.no_grad():
            clean = task_logits(s.model, s.task, cols=self.at.cols) if self.metric.needs_clean else None  # (B, C, V)
            with s.model.hooks(hooks):
                logits = task_logits(s.model, s.task, cols=self.at.cols)  # (B, C, V)
        self._done(s.task.tokens.shape[0])
        return self.metric(logits, self.at, clean)

    def _done(self, prompts: int) -> None:
        """One node set run on ``prompts`` prompts: the progress display's step (counted in prompts, since the
        resumed sets run a block of prompts at a time)."""
        if self.s.progress is not None:
            self.s.progress(prompts)

    def _resumed(self, todo: Sequence[frozenset], rows: slice) -> list[torch.Tensor]:
        """``(b,)`` per-prompt metric of each node set on prompts ``rows``: the every-head-ablated forward recorded
        once, then each set resumed from the run of its nearest set (:func:`plan`) where their heads first differ."""
        from headlens.interventions.sweep import task_logits

        s = self.s
        task, named = s.task.rows(rows), None if s.named is None else s.named.rows(rows)
        at, repl = task.at(self.at.cols), [r[rows] for r in self.repl]  # (b, T, H, d_head) per layer
        B, T = task.tokens.shape
        none = [(f"blocks.{layer}.attn.hook_z", lambda z, hook, r=r: r.to(z)) for layer, r in enumerate(repl)]
        answers = answer_columns(task, [self.metric.name])  # (b, 2) logit_diff's: only they are unembedded
        with torch.no_grad():
            run = ResumePatcher(s.model, task, columns=answers, hooks=none)
            run._buf = run.clean_logits  # the logits buffer: the recorded ones are not read again (no 2nd copy)
            clean = task_logits(s.model, task, cols=at.cols) if self.metric.needs_clean else None  # (b, C, V)
            keeps = {None: self._keep(frozenset(), named, B, T)} | {n: self._keep(n, named, B, T) for n in todo}
            steps = plan(keeps, run.positions)  # None: the every-head-ablated run
            left = Counter(parent for _, parent, _, _ in steps)  # runs still to resume from each set's
            runs, out = {None: run.record}, {}
            for n, parent, layer, recv in steps:
                rec = runs[parent] if layer is None else run.suffix(
                    layer, recv, lambda P, k=keeps[n]: self._hooks(k, repl, P), runs[parent])
                logits = next(run.read(rec.final, None, 1))  # (b, T, V), or (b, C, 2) logit_diff's answers
                out[n] = (self.metric(logits, run.metric_task, clean) if answers is not None
                          else self.metric(logits if at.cols is None else logits[:, at.cols], at, clean))
                self._done(task.tokens.shape[0])
                left[parent] -= 1
                if not left[parent]:
                    runs.pop(parent)
                if left[n]:
                    runs[n] = rec
        return [out[n] for n in todo]

    @staticmethod
    def _hooks(keep: torch.Tensor, repl: list[torch.Tensor], P: torch.Tensor | None) -> list:
        """One hook on every layer's ``hook_z`` ``(b, S, H, d_head)`` (one name per layer cost the bridge more than
        the hook): the heads clean where ``keep`` ``(L, b, T, H)`` says, ``repl`` elsewhere, at ``P`` ``(b, S)``."""
        def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:
            layer = int(hook.name.split(".")[1])
            k, r = keep[layer], repl[layer]  # (b, T, H), (b, T, H, d_head)
            if P is not None:
                k, r = _at(k, P, 1), _at(r, P, 1)  # (b, S, H), (b, S, H, d_head)
            return torch.where(k[..., None], z, r.to(z))

        return [(lambda name: name.endswith(".attn.hook_z"), hook)]

    def every_head(self) -> Nodes:
        return {(f"L{layer}H{h}", "all") for layer in range(self.L) for h in range(self.H)}


def plan(keeps: dict[Any, torch.Tensor], positions: Any) -> list[tuple[Any, Any, int | None, Any]]:
    """The order the node sets run in: ``(set, parent, layer, recv)``, each resumed at block ``layer`` from an earlier
    set's run (the first key of ``keeps``: every head ablated) at the positions ``recv`` ``(b, T)`` where their
    ``keeps`` ``(L, b, T, H)`` differ; the parent is the one whose resumed blocks x positions are fewest (sets in
    order of size: a curve's circuits grow). ``layer`` None: the same heads clean, the parent's run is the set's.
    ``positions``: :meth:`ResumePatcher.positions`."""
    first, *todo = keeps
    done, out = [first], []
    for n in sorted(todo, key=lambda n: int(keeps[n].sum())):
        best = None
        for parent in reversed(done):  # on a tie the latest: the runs before it can go sooner
            diff = keeps[n] ^ keeps[parent]  # (L, b, T, H)
            layers = diff.flatten(1).any(1).nonzero()
            if not len(layers):
                best = (0, parent, None, None)
                break
            layer, recv = int(layers[0]), diff.any(0).any(-1)  # (b, T)
            P = positions(recv[None])
            cost = (len(diff) - layer) * (diff.shape[2] if P is None else P.shape[1])
            if best is None or cost < best[0]:
                best = (cost, parent, layer, recv)
        out.append((n, *best[1:]))
        done.append(n)
    return out


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
    nodes = roots | edge_nodes(circuit)
    ranked = measured.sort_values("effect", key=abs, ascending=False, kind="stable") if len(measured) else measured
    mib = [roots | edge_nodes(ranked.head(max(1, math.ceil(k * len(ranked))))) for k in MIB_FRACTIONS] if len(ranked) else []
    n = len(circuit)
    steps = sorted({max(1, round(n ** (i / max(1, max_curve - 1)))) for i in range(max_curve)}) if n else []
    curve = [roots | edge_nodes(circuit.head(k)) for k in steps]
    m_clean, m_none, m_circ = a.values([a.every_head(), set(), nodes, *mib, *curve])[:3]  # every set in one pass
    out: dict[str, Any] = {"faithfulness": _recovered(a, nodes, m_clean, m_none),
                           "ioi_faithfulness": {"F_M": m_clean, "F_C": m_circ, "F_0": m_none,
                                                "abs_diff": abs(m_clean - m_circ),
                                                "ratio": m_circ / m_clean if abs(m_clean) > 1e-12 else float("nan")}}
    fs = [_recovered(a, m, m_clean, m_none) for m in mib]
    out["mib"] = {"fractions": list(MIB_FRACTIONS), "faithfulness": fs, "n_edges": len(ranked),
                  "cpr": area(MIB_FRACTIONS, fs) if fs else float("nan"),
                  "cmd": area(MIB_FRACTIONS, [abs(1 - f) for f in fs]) if fs else float("nan")}
    out["faithfulness_curve"] = [float(np.round(_recovered(a, c, m_clean, m_none), 12)) for c in curve]
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
