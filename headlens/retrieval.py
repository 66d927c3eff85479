"""The top-1 scan: for ``"top1"`` detectors (retrieval heads), which key each head attends to *most*.

Why it looks like this:

* **A different statistic.** The mass scan (:mod:`headlens.scan`) sums attention on the targets;
  a retrieval head (Wu et al. 2024) is judged by its top-1 key. So a top-1 detector is scored
  here, into the same per-prompt ``(P, L, H)`` sums, row counts and uniform baselines the mass
  scan produces (:class:`headlens.scan.DetectorStats`), and :mod:`headlens.stats` turns them into
  scores, bootstrap CIs, lifts and labels exactly as for every other detector. The baseline of a
  row is ``1 / (keys visible from q)``: uniform attention's top-1 is a uniformly random key.
* **Only the rows that count.** A needle prompt has a handful of copy steps among thousands of
  positions; only those rows' maxima are needed. ``"sparse"``: q and k come from the backend's
  hooks (:class:`headlens.lse.AttentionSpec`: after RoPE, its own scale, window, soft-capping,
  GQA), and each counted row's scores are formed against blocks of keys, keeping a running max
  and argmax: memory O(R·block) per head, never a full ``(T, T)`` pattern nor even a full row.
  ``"dense"`` (backends without q/k specs, short prompts): the row maxima of ``hook_pattern``.
  Both give the same top-1 up to exact ties (tests compare them).
* **Ties** go to the earliest key (``argmax``); a head with exactly uniform attention therefore
  "attends" to the first key, never to a copy target further right.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from headlens.detectors.base import Detector, as_targets
from headlens.lse import AttentionSpec, heads_first
from headlens.probes import Probe, collate
from headlens.scan import DetectorStats, _ScanDone, attention_specs, choose_path
from headlens.vocab import vocab

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
    if k.shape[1] != H:
        k = k.repeat_interleave(H // k.shape[1], dim=1)  # (B, H, T, d): each KV head serves its query group
    scale = spec.scale if spec.scale is not None else 1.0 / math.sqrt(d)
    r = rows.clamp_min(0)  # (B, R)
    R, M = r.shape[1], targets.shape[2]
    qr = q.gather(2, r[:, None, :, None].expand(B, H, -1, d))  # (B, H, R, d): only the counted rows
    best = torch.full((B, H, R), float("-inf"), device=q.device)
    n_best = torch.zeros(B, H, R, device=q.device)
    at = torch.full((B, H, R, M), float("nan"), device=q.device)  # each target's score (NaN: no target)
    for k0 in range(0, T, block):
        k1 = min(T, k0 + block)
        s = (qr @ k[:, :, k0:k1].transpose(-2, -1)) * scale  # (B, H, R, kb)
        if spec.softcap is not None:
            s = spec.softcap * torch.tanh(s / spec.softcap)
        gap = r[:, :, None] - torch.arange(k0, k1, device=q.device)[None, None, :]  # (B, R, kb): q - k
        hidden = torch.zeros_like(gap, dtype=torch.bool)
        if spec.causal:
            hidden |= gap < 0
        if spec.window is not None:
            hidden |= gap >= spec.window
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
    """Score ``"top1"`` detectors on every prompt of ``probe`` (same outputs as :func:`headlens.scan.scan`).

    Args:
        model: any headlens backend.
        probe: the prompts (for retrieval: :func:`headlens.haystack.needle_haystack`).
        detectors: ``"top1"`` detectors; all share the forward passes.
        batch_size: prompts per forward pass.
        progress: called with the number of prompts done per batch.
        path: ``"auto"``, ``"dense"`` or ``"sparse"`` (how the row maxima are read; module docstring).
        info: filled with ``{"scan_path": ...}``.
    """
    L, H, P, D = model.n_layers, model.n_heads, len(probe), len(detectors)
    sums = torch.zeros(P, L, H, D, dtype=torch.float64)
    counts = torch.zeros(P, D, dtype=torch.float64)
    base = torch.zeros(P, D, dtype=torch.float64)
    v = vocab(model)
    pad_id = getattr(model.tokenizer, "pad_token_id", None)
    pad_id = int(pad_id) if pad_id is not None else v.ordinary[0]
    specs = attention_specs(model)
    state: dict[str, Any] = {}
    paths: list[str] = []

    def dense_hook(layer: int) -> Callable[..., None]:
        def reduce_layer(pattern: torch.Tensor, hook: Any) -> None:  # (B, H, Q, K)
            share = _share_from_pattern(pattern, state["rows"], state["targets"])  # (B, H, R, D*M)
            state["out"][:, layer] = _per_detector(share, len(detectors))
            if layer == L - 1:
                raise _ScanDone

        return reduce_layer

    def sparse_hook(layer: int, which: str) -> Callable[..., None]:
        spec = specs[layer]

        def capture(x: torch.Tensor, hook: Any) -> None:
            state[which] = heads_first(x, spec.layout)  # (B, H, T, d)
            if "q" in state and "k" in state:
                share = top1_share(state.pop("q"), state.pop("k"), spec, state["rows"], state["targets"],
                                   state["key_valid"])  # (B, H, R, D*M)
                state["out"][:, layer] = _per_detector(share, len(detectors))
                if layer == L - 1:
                    raise _ScanDone

        return capture

    dense_hooks = [(f"blocks.{layer}.attn.hook_pattern", dense_hook(layer)) for layer in range(L)]
    sparse_hooks = [] if specs is None else [
        (name, sparse_hook(layer, which)) for layer, s in enumerate(specs)
        for name, which in ((s.q_hook, "q"), (s.k_hook, "k"))]
    with torch.inference_mode():
        for start in range(0, P, batch_size):
            rows = range(start, min(start + batch_size, P))
            batch = collate(probe, rows, model.is_causal, v.special, pad_id, model.device)
            chosen = choose_path(path, model, tuple(batch.tokens.shape))
            paths.append(chosen)
            tg = _stack([as_targets(d.targets(batch), batch) for d in detectors])  # (B, Q, D*M)
            n = (tg.view(*tg.shape[:2], D, -1) >= 0).any(-1).double().transpose(1, 2)  # (B, D, Q): rows that count
            rows_ = _rows(tg)
            state.update(targets=_at_rows(tg, rows_), rows=rows_, key_valid=None if model.is_causal else batch.valid,
                         out=torch.zeros(len(rows), L, H, D, dtype=torch.float64, device=batch.tokens.device))
            mask = None if model.is_causal else batch.valid.long()
            try:
                with model.hooks(sparse_hooks if chosen == "sparse" else dense_hooks):
                    model.forward(batch.tokens, attention_mask=mask)
            except _ScanDone:
                pass
            visible = batch.n_visible.to(n.device)  # (B, Q)
            sums[start:start + len(rows)] = state["out"].cpu()
            counts[start:start + len(rows)] = n.sum(-1).cpu()
            base[start:start + len(rows)] = (n / visible[:, None]).sum(-1).cpu()
            state.clear()
            if progress is not None:
                progress(len(rows))
    if info is not None:
        info["scan_path"] = "+".join(sorted(set(paths))) or "none"
    return {d.name: DetectorStats(sums[..., i], counts[:, i], base[:, i]) for i, d in enumerate(detectors)}
