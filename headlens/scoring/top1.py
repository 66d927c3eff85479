"""The top-1 scan: for ``"top1"`` detectors (retrieval heads), which key each head attends to *most*.

Why it looks like this:

* **A different statistic.** The mass scan (:mod:`headlens.scoring.engine`) sums attention on the targets;
  a retrieval head (Wu et al. 2024) is judged by its top-1 key. So a top-1 detector is scored
  here, into the same per-prompt ``(P, L, H)`` sums, row counts and uniform baselines the mass
  scan produces (:class:`headlens.scoring.engine.DetectorStats`), and :mod:`headlens.scoring.stats` turns them into
  scores, bootstrap CIs, lifts and labels exactly as for every other detector. The baseline of a
  row is ``1 / (keys visible from q)``: uniform attention's top-1 is a uniformly random key.
* **Only the rows that count.** A needle prompt has a handful of copy steps among thousands of
  positions; only those rows' maxima are needed. ``"sparse"``: q and k come from the backend's
  hooks (:class:`headlens.models.attention.AttentionSpec`: after RoPE, its own scale, window, soft-capping,
  GQA), and each counted row's scores are formed against blocks of keys, keeping a running max
  and argmax: memory O(R·block) per head, never a full ``(T, T)`` pattern nor even a full row.
  ``"dense"`` (backends without q/k specs, short prompts): the row maxima of ``hook_pattern``.
  Both give the same top-1 up to exact ties (tests compare them).
* **Ties** are split evenly (the expectation under random tie-breaking), so a head with exactly
  uniform attention scores its uniform baseline, like every other detector.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from headlens.detectors.base import Detector, as_targets
from headlens.models.attention import AttentionSpec
from headlens.probes.base import Probe, ProbeBatch
from headlens.scoring.engine import DetectorStats, Reducer, run_batches
from headlens.scoring.lse import expand_kv, out_of_view, scores

KEY_BLOCK = 4096  # keys per block of the running max


def top1_share(q: torch.Tensor, k: torch.Tensor, spec: AttentionSpec, rows: torch.Tensor, targets: torch.Tensor,
               key_valid: torch.Tensor | None = None, block: int = KEY_BLOCK) -> torch.Tensor:
    """Whether each head's top-1 key at the query positions ``rows`` is a target, by a running max over key blocks.

    Ties are split evenly (the expectation under random tie-breaking): a target among ``n`` keys that
    share the row's largest score counts ``1 / n``, so a head with exactly uniform attention scores
    exactly the uniform baseline.

    Args:
        q: ``(B, H, T, d)`` queries; k: ``(B, H_kv, T, d)`` keys (``H_kv`` divides ``H``: GQA).
        spec: how the layer makes its scores (scale, causal, window, soft-capping).
        rows: ``(B, R)`` long query positions (``-1``: padding).
        targets: ``(B, R, M)`` long target keys of those rows (``-1``: none).
        key_valid: ``(B, T)`` bool, False at masked (pad) keys; None: all real.
        block: keys per block.

    Returns:
        ``(B, H, R, M)`` float64: 1 where the target is the row's unique top-1 key, ``1 / n`` on an n-way tie.

    >>> q = torch.tensor([[[[1.0], [1.0], [-1.0]]]]); k = torch.tensor([[[[0.0], [2.0], [1.0]]]])
    >>> top1_share(q, k, AttentionSpec("q", "k", "BHTD"), torch.tensor([[1, 2]]), torch.tensor([[[1], [1]]])).tolist()
    [[[[1.0], [0.0]]]]
    """
    B, H, T, d = q.shape
    k = expand_kv(k, H)  # (B, H, T, d): each KV head serves its query group
    r = rows.clamp_min(0)  # (B, R)
    R, M = r.shape[1], targets.shape[2]
    qr = q.gather(2, r[:, None, :, None].expand(B, H, -1, d))  # (B, H, R, d): only the counted rows
    best = torch.full((B, H, R), float("-inf"), device=q.device)
    n_best = torch.zeros(B, H, R, device=q.device)
    at = torch.full((B, H, R, M), float("nan"), device=q.device)  # each target's score (NaN: no target)
    for k0 in range(0, T, block):
        k1 = min(T, k0 + block)
        s = scores(qr, k[:, :, k0:k1], spec)  # (B, H, R, kb)
        gap = r[:, :, None] - torch.arange(k0, k1, device=q.device)[None, None, :]  # (B, R, kb): q - k
        hidden = out_of_view(gap, spec)
        if key_valid is not None:
            hidden |= ~key_valid[:, None, k0:k1]
        s = s.masked_fill(hidden[:, None], float("-inf"))
        inside = (targets >= k0) & (targets < k1)  # (B, R, M): targets in this block
        g = s.gather(3, (targets - k0).clamp(0, k1 - k0 - 1)[:, None].expand(B, H, -1, -1))  # (B, H, R, M)
        at = torch.where(inside[:, None], g, at)
        top = s.amax(-1)  # (B, H, R)
        n_top = (s == top[..., None]).sum(-1).float()  # (B, H, R)
        n_best = torch.where(top > best, n_top, torch.where(top == best, n_best + n_top, n_best))
        best = torch.maximum(best, top)
    return (at == best[..., None]).double() / n_best[..., None].clamp_min(1).double()  # (B, H, R, M)


def _share_from_pattern(pattern: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """:func:`top1_share` read off the attention pattern ``(B, H, Q, K)`` (the dense path)."""
    B, H, _, K = pattern.shape
    p = pattern.gather(2, rows.clamp_min(0)[:, None, :, None].expand(B, H, -1, K))  # (B, H, R, K)
    top = p.amax(-1, keepdim=True)  # (B, H, R, 1)
    n_top = (p == top).sum(-1, keepdim=True)  # (B, H, R, 1)
    at = p.gather(3, targets.clamp_min(0)[:, None].expand(B, H, -1, -1))  # (B, H, R, M)
    return ((at == top) & (targets >= 0)[:, None]).double() / n_top.double()


def _rows(targets: torch.Tensor) -> torch.Tensor:
    """``(B, R)`` query positions with at least one target (``-1`` padded), R the most in a prompt."""
    has = (targets >= 0).any(-1)  # (B, Q)
    R = max(int(has.sum(-1).max()) if has.numel() else 0, 1)
    pos = torch.arange(has.shape[1], device=has.device).expand_as(has)
    ranked = torch.where(has, pos, torch.full_like(pos, has.shape[1]))
    idx = ranked.topk(R, dim=-1, largest=False).values  # (B, R) ascending
    return torch.where(idx < has.shape[1], idx, torch.full_like(idx, -1))


def _stack(parts: list[torch.Tensor]) -> torch.Tensor:
    """``D x (B, Q, M_d)`` -> ``(B, Q, D * M)`` (``M = max M_d``), ``-1`` padded: detector d owns columns d*M.."""
    M = max(t.shape[2] for t in parts)
    return torch.cat([torch.nn.functional.pad(t, (0, M - t.shape[2]), value=-1) for t in parts], 2)


def _at_rows(targets: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``(B, Q, C)`` targets -> ``(B, R, C)`` at the query positions ``rows`` (``-1`` on padding rows)."""
    at = targets.gather(1, rows.clamp_min(0)[:, :, None].expand(-1, -1, targets.shape[2]))  # (B, R, C)
    return torch.where((rows >= 0)[:, :, None], at, torch.full_like(at, -1))


def _per_detector(share: torch.Tensor, D: int) -> torch.Tensor:
    """``(B, H, R, D*M)`` shares -> ``(B, H, D)`` float64 hits per prompt (rows and targets summed)."""
    B, H, R, C = share.shape
    return share.view(B, H, R, D, C // D).sum((2, 4))  # (B, H, D)


def scan_top1(model: Any, probe: Probe, detectors: Sequence[Detector], batch_size: int = 8,
              progress: Callable[[int], None] | None = None, path: str = "auto",
              info: dict[str, Any] | None = None) -> dict[str, DetectorStats]:
    """Score ``"top1"`` detectors on every prompt of ``probe`` (same outputs as :func:`headlens.scoring.scan.scan`).

    Args:
        model: any headlens backend.
        probe: the prompts (for retrieval: :func:`headlens.probes.haystack.needle_haystack`).
        detectors: ``"top1"`` detectors; all share the forward passes.
        batch_size: prompts per forward pass.
        progress: called with the number of prompts done per batch.
        path: ``"auto"``, ``"dense"`` or ``"sparse"`` (how the row maxima are read; module docstring).
        info: filled with ``{"scan_path": ...}``.
    """
    D = len(detectors)

    def prepare(batch: ProbeBatch) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
        tg = _stack([as_targets(d.targets(batch), batch) for d in detectors])  # (B, Q, D*M)
        n = (tg.view(*tg.shape[:2], D, -1) >= 0).any(-1).double().transpose(1, 2)  # (B, D, Q): rows that count
        rows = _rows(tg)  # (B, R): the query positions with a target
        visible = batch.n_visible.to(n.device)  # (B, Q)
        return {"targets": _at_rows(tg, rows), "rows": rows}, n.sum(-1), (n / visible[:, None]).sum(-1)

    def from_pattern(pattern: torch.Tensor, st: dict[str, Any]) -> torch.Tensor:  # (B, H, Q, K) -> (B, H, D)
        return _per_detector(_share_from_pattern(pattern, st["rows"], st["targets"]), D)

    def from_qk(q: torch.Tensor, k: torch.Tensor, spec: AttentionSpec, st: dict[str, Any]) -> torch.Tensor:
        return _per_detector(top1_share(q, k, spec, st["rows"], st["targets"], st["key_valid"]), D)

    top1 = Reducer(prepare, from_pattern, from_qk)
    return run_batches(model, probe, detectors, top1, batch_size, progress, path, info)
