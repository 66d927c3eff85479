"""The substitution test to first order: every described head's substituted and mean-ablated loss change from
one forward and one backward pass, and which heads still run exactly.

Why it looks like this:

* **One gradient, both variants.** The test replaces a head's ``z`` (:mod:`headlens.atlas.substitute`): by
  ``A_desc @ v`` (its description's pattern on its own values) or by its mean over the windows. To first
  order a window's loss moves by ``<dL/dz, z' - z>`` (attribution patching,
  :func:`headlens.interventions.attribution.z_gradients`), and since ``z = A @ v`` this is the same as
  ``<dL/dA, A_desc - A>`` at the pattern: one backward pass gives every head's estimate, substituted and
  mean-ablated, per window. The loss is each window's mean next-token loss, summed over the windows (the
  windows do not mix, so each window's gradient is its own, and the pass runs :data:`CHUNK` windows at a time:
  the graph of 8 windows of 128 tokens through SmolLM2 held 2.5 GB, most of an atlas' peak).
* **Where it is run exactly.** The estimate is linear: a head whose change is large (a description far from
  its attention, a head the model leans on) is where it is least trusted and matters most. So the heads with
  the largest estimated effects (:data:`EXACT_TOP` of :data:`SUBST_EXACT`) and a seeded random sample of the
  rest run exactly, and always the heads of the first :data:`EXACT_LAYERS` layers (on SmolLM2 their
  estimates are off by 10x to 1000x: a change there is amplified through every later layer) and copy
  suppressors (their gate reads the exact loss change on chosen positions).
  Their share kept and its interval are exact; the others carry the estimate (no interval), labelled
  ``estimated`` in ``descriptions.csv`` and on their page. ``subst="exact"`` runs every head exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

SUBST_EXACT = 12  # described heads whose share kept is run exactly under subst="estimate" (the rest estimated)
EXACT_TOP = 2 / 3  # of those, the share picked by the largest estimated effect; the rest at random (seeded)
ALWAYS_EXACT = ("copy_suppression",)  # roles whose gate needs the exact loss change on chosen positions
EXACT_LAYERS = 2  # heads of the first layers always run exactly: there the estimate is off by 10x to 1000x
CHUNK = 2  # windows per backward pass: bounds the graph's memory (each window's gradient is its own)


def first_order(model: Any, tokens: torch.Tensor, loss: Callable[[torch.Tensor, slice], torch.Tensor],
                patterns: dict[tuple[int, int], torch.Tensor], mean: Any,
                chunk: int = CHUNK) -> tuple[dict[tuple[int, int], torch.Tensor], dict[tuple[int, int], torch.Tensor], Any]:
    """``(substituted, mean_ablated, mean)``: ``(layer, head) -> (B,)`` float64 estimated change of each window's
    mean next-token loss with that head's ``z`` replaced by ``pattern @ v`` (``patterns[(layer, head)]``
    ``(B, Q, K)``; rows summing to 0 keep the real ``z``) or by its mean over the windows; ``loss(logits,
    rows)``: the losses of the windows ``tokens[rows]`` summed (``(b, T, V)`` -> a scalar); ``mean``: the
    :class:`~headlens.interventions.ablation.Replacement` (``method="mean"``) built from this forward's ``z``
    when ``mean`` is None. ``chunk`` windows per backward pass (the windows do not mix: the same gradients)."""
    from headlens.interventions.ablation import Replacement
    from headlens.interventions.attribution import z_gradients

    layers = sorted({la for la, _ in patterns})
    parts: list[tuple[dict, dict, dict]] = []  # per chunk of windows: z, its gradient, the values
    step = max(1, chunk)
    for start in range(0, tokens.shape[0], step):
        rows = slice(start, start + step)
        kept: dict[int, torch.Tensor] = {}

        def keep(layer: int, into: dict[int, torch.Tensor] = kept) -> Any:
            def hook(v: torch.Tensor, hook: Any) -> None:  # (b, T, H_kv, d_head)
                into[layer] = v.detach()
            return hook

        def total(rows: slice = rows) -> torch.Tensor:
            return loss(model(tokens[rows]), rows)

        zc, gc = z_gradients(model, total, layers, [(f"blocks.{la}.attn.hook_v", keep(la)) for la in layers])
        parts.append((zc, gc, kept))
    z, grads, kept = ({la: torch.cat([p[i][la] for p in parts]) for la in layers} for i in range(3))  # (B, ...)
    mean = mean if mean is not None else Replacement("mean", z)
    sub, abl = {}, {}
    for layer in layers:
        zl, g = z[layer].float(), grads[layer].float()  # (B, T, H, d_head) each
        v = kept[layer].float()  # (B, T, H_kv, d_head)
        group = zl.shape[2] // v.shape[2]  # query heads per key/value head
        dz_mean = mean.z(layer, zl) - zl  # (B, T, H, d_head)
        for (la, h), p in patterns.items():
            if la != layer:
                continue
            zh = zl[:, :, h]  # (B, T, d_head)
            real = p.sum(-1, keepdim=True) > 0  # (B, Q, 1): rows the description predicts
            dz = torch.where(real, torch.bmm(p.to(zh), v[:, :, h // group]), zh) - zh  # (B, T, d_head)
            sub[(la, h)] = (g[:, :, h] * dz).sum((1, 2)).double().cpu()  # (B,)
            abl[(la, h)] = (g[:, :, h] * dz_mean[:, :, h]).sum((1, 2)).double().cpu()  # (B,)
    return sub, abl, mean


def exact_heads(described: Sequence[Any], sub: dict[tuple[int, int], torch.Tensor],
                abl: dict[tuple[int, int], torch.Tensor], n: int, seed: int = 0) -> dict[tuple[int, int], str]:
    """The heads run exactly: the roles of :data:`ALWAYS_EXACT` and the heads of the first :data:`EXACT_LAYERS`
    layers, then of ``n`` more, ``EXACT_TOP`` of them (rounded up) by the largest estimated effect
    (``max(|mean-ablated|, |substituted|)``, each averaged over the windows), the rest drawn at random (seeded)
    from the others: head -> why (``"role"``, ``"layer"``, ``"top"``, ``"random"``, or ``"all"`` where ``n``
    covers every head)."""
    keys = [(d.layer, d.head) for d in described]
    out = {(d.layer, d.head): "layer" for d in described if d.layer < EXACT_LAYERS}
    out.update({(d.layer, d.head): "role" for d in described if d.role in ALWAYS_EXACT})
    rest = [k for k in keys if k not in out]
    if n >= len(rest):
        return {k: "all" for k in keys}
    size = {k: max(abs(float(abl[k].mean())), abs(float(sub[k].mean()))) for k in rest}
    top = sorted(rest, key=lambda k: -size[k])[: math.ceil(n * EXACT_TOP)]
    others = [k for k in rest if k not in set(top)]
    gen = torch.Generator().manual_seed(seed)
    drawn = [others[int(i)] for i in torch.randperm(len(others), generator=gen)[: n - len(top)]]
    return {**out, **dict.fromkeys(top, "top"), **dict.fromkeys(drawn, "random")}
