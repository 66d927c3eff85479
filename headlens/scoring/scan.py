"""Scan a probe: score every detector on every prompt, each by the engine that reads it.

Attention-mass detectors (``kind == "mass"``) go through :func:`headlens.scoring.engine.run_batches`
with the mass reducer (the pattern on short prompts, q·k and the row log-sum-exp on long ones), each
detector's targets in the cheaper of their two forms (:func:`_form`: an index list, or its rule);
``"top1"`` detectors (retrieval heads) through :func:`headlens.scoring.top1.scan_top1`. The engine's
docstring says why it works as it does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from headlens.detectors.base import Detector, as_targets, predicate_counts
from headlens.errors import DetectorError
from headlens.probes.base import Probe, ProbeBatch
from headlens.scoring.engine import DetectorStats, Progress, Reducer, run_batches
from headlens.scoring.lse import (
    PackedTargets,
    PredicateTargets,
    Targets,
    add_by_prompt,
    gather_heads,
    mass_under,
    target_mass,
)
from headlens.scoring.top1 import scan_top1

WINDOW_BYTES = 16 * 2**20  # a windowed detector is asked for this many bytes of (B, C, T) targets at a time
INDEX_MAX = 2**19  # a set detector with a predicate keeps an index list up to this many targets a batch (~15 MiB)


def _windows(det: Detector, batch: ProbeBatch) -> Iterator[torch.Tensor]:
    """The detector's ``(B, C, M)`` targets, row window by row window (one window unless ``windowed``)."""
    B, T = batch.tokens.shape
    if not det.windowed:
        yield as_targets(det.targets(batch), batch)
        return
    rows = max(1, WINDOW_BYTES // (8 * B * T))
    for r0 in range(0, T, rows):
        t = det.targets(batch.window(r0, min(T, r0 + rows)))
        yield t if t.dtype != torch.bool else as_targets(t, batch)[:, r0:r0 + rows]


def _form(det: Detector, batch: ProbeBatch) -> Targets:
    """The cheaper form of a detector's targets on ``batch``: its rule when the index list would pass
    ``INDEX_MAX`` targets (set detectors with a predicate), else the index list, packed."""
    if det.predicate is not None and det.windowed:  # one target a row (previous_token ...) is always a short list
        n = predicate_counts(det.predicate, batch)  # (B, T), one block of the rule at a time
        if int(n.sum()) > INDEX_MAX:
            return PredicateTargets(det.predicate, batch, n)
    return PackedTargets.pack(_windows(det, batch), *batch.tokens.shape)


def _targets(batch: ProbeBatch, dets: Sequence[Detector]) -> tuple[list[Targets], torch.Tensor, torch.Tensor]:
    """Every detector's targets in their cheaper form, with per-prompt row counts and uniform baselines ``(B, D)``."""
    visible = batch.n_visible.to(batch.tokens.device)  # (B, Q)
    packed, counts, base = [], [], []
    for d in dets:
        tg = _form(d, batch)
        n = tg.counts()  # (B, Q): |T(q)|
        counts.append((n > 0).sum(-1).double())  # (B,)
        base.append((n / visible).sum(-1))  # (B,)
        packed.append(tg)
    return packed, torch.stack(counts, 1), torch.stack(base, 1)


def _reduce_pattern(pattern: torch.Tensor, targets: Sequence[Targets]) -> torch.Tensor:
    """``(B, H, Q, K)`` pattern -> ``(B, H, D)`` float64 per-prompt target mass (the dense path)."""
    B, H, Q, K = pattern.shape
    out = torch.zeros(B, H, len(targets), dtype=torch.float64, device=pattern.device)
    for i, tg in enumerate(targets):
        if isinstance(tg, PredicateTargets):  # the rule, a block of rows at a time
            step = max(1, WINDOW_BYTES // (4 * B * H * K))
            for q0 in range(0, Q, step):
                out[:, :, i] += mass_under(pattern[:, :, q0:q0 + step], tg.mask(q0, min(Q, q0 + step), 0, K))
            continue
        b, q, k = tg.entries(0, Q)
        if len(k):
            add_by_prompt(out, gather_heads(pattern, b, q, k), b, i)
    return out


def scan(
    model: Any,
    probe: Probe,
    detectors: Sequence[Detector],
    batch_size: int = 32,
    progress: Progress | None = None,
    path: str = "auto",
    info: dict[str, Any] | None = None,
) -> dict[str, DetectorStats]:
    """Score ``detectors`` on every prompt of ``probe``.

    Args:
        model: any headlens backend (native GPT, bridge).
        probe: the prompts and their annotations.
        detectors: pattern detectors to score; all see the same forward passes.
        batch_size: prompts per forward pass (results do not depend on it).
        progress: optional callback, called with the number of prompts done per batch.
        path: ``"auto"``, ``"dense"`` or ``"sparse"`` (module docstring).
        info: when given, filled with ``{"scan_path": ...}``: the path(s) the batches took.

    Returns:
        detector name -> :class:`DetectorStats` with per-prompt sums.
    """
    if spanned := [d.name for d in detectors if d.targets is None]:
        raise DetectorError(f"{spanned} have no token targets for the scan (weight scores, or annotated "
                            f"spans scored by headlens.scoring.annotated)")
    if any(d.kind == "top1" for d in detectors):  # scored by the top-1 engine (retrieval heads)
        return _with_top1(model, probe, detectors, batch_size, progress, path, info)

    def prepare(batch: ProbeBatch) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
        packed, c, b = _targets(batch, detectors)
        return {"targets": packed}, c, b

    mass = Reducer(prepare, lambda pattern, st: _reduce_pattern(pattern, st["targets"]),
                   lambda q, k, spec, st: target_mass(q, k, spec, st["targets"], st["key_valid"]))
    return run_batches(model, probe, detectors, mass, batch_size, progress, path, info)


def _with_top1(model: Any, probe: Probe, detectors: Sequence[Detector], batch_size: int, progress: Progress | None,
               path: str, info: dict[str, Any] | None) -> dict[str, DetectorStats]:
    """``"top1"`` detectors through :func:`headlens.scoring.top1.scan_top1`, the others through :func:`scan`."""
    top1 = [d for d in detectors if d.kind == "top1"]
    mass = [d for d in detectors if d.kind != "top1"]
    i1: dict[str, Any] = {}
    i2: dict[str, Any] = {"scan_path": "none"}
    out = scan_top1(model, probe, top1, batch_size, None if mass else progress, path, i1)
    if mass:
        out.update(scan(model, probe, mass, batch_size, progress, path, i2))
    if info is not None:
        info["scan_path"] = "+".join(sorted({*i1["scan_path"].split("+"), *i2["scan_path"].split("+")} - {"none"}))
    return {d.name: out[d.name] for d in detectors}
