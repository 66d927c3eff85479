"""A tiny bridged model with every head described, and the substitution's reference: the model's own forward
with heads' ``z`` replaced in hooks (``pattern @ v``, or the mean over the windows), no resumption, no copies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

MIXES = [{"previous_token": 1.0}, {"first_token": 0.5, "recent_4": 0.5}, {"uniform": 1.0}]


def bridged_described(family: str, path: Path, plant: bool = False, **overrides: Any) -> tuple[Any, list[Any]]:
    """``(model, described)``: a random-weight ``family`` model bridged (``plant``: L0H0 made a previous-token
    head), every head described by one of :data:`MIXES` in turn."""
    import transformers
    from hf_families import FAMILIES, JOINING, build, plant_offset_heads, save_tokenizer

    import headlens
    from headlens.atlas.describe import Description

    build(family, path, tokenizer=False, **overrides)
    hf = getattr(transformers, {**FAMILIES, **JOINING}[family].model).from_pretrained(path).eval()
    if plant:
        plant_offset_heads(hf, {(0, 0): 1})
    hf.save_pretrained(path)
    save_tokenizer(path)
    model = headlens.load(f"hf:{path}")
    L, H = model.cfg.n_layers, model.cfg.n_heads
    return model, [Description(la, h, "previous_token", "previous_token", 0.9, (0.8, 1.0), "",
                               mixture=MIXES[(la * H + h) % 3]) for la in range(L) for h in range(H)]


def reference_patterns(model: Any, described: list[Any], held: list[torch.Tensor], classes: Any) -> tuple[Any, dict]:
    """``(batch, patterns)``: the held-out batch and each description's simulated pattern ``(B, Q, K)``."""
    from headlens.atlas.heldout import _batch
    from headlens.atlas.rules import candidate_rules, rule_targets
    from headlens.atlas.substitute import rule_predictions, simulated_patterns
    from headlens.models.vocab import vocab

    rules = candidate_rules()
    batch = _batch(held, vocab(model).special, classes)
    T = batch.tokens.shape[1]
    q, k = torch.arange(T)[:, None], torch.arange(T)[None, :]
    cells = (k <= q) & batch.valid[:, None, :] & batch.query_ok[:, :, None]
    hits = {r: rule_targets(rules[r], batch, T) * cells for mix in MIXES for r in mix}
    return batch, simulated_patterns(described, rule_predictions(batch, hits), batch.query_ok)


def swapped(model: Any, batch: Any, patterns: dict, replace_: dict[tuple[int, int], str],
            at: str | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(loss, stream)``: each window's loss ``(B,)`` with the heads of ``replace_`` replaced (``"mean"``: their
    ``z`` averaged over the windows; else ``patterns[head] @ v``), and the residual stream at hook ``at``
    ``(B, T, D)`` in that forward (None without ``at``)."""
    from headlens.atlas.substitute import _loss

    L, H = model.cfg.n_layers, model.cfg.n_heads
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.tokens)
    z_mean = {la: cache[f"blocks.{la}.attn.hook_z"].mean(0, keepdim=True) for la in range(L)}  # (1, T, H, d)
    kept: dict[Any, torch.Tensor] = {}

    def keep(name):
        def hook(x, hook):
            kept[name] = x
        return hook

    def swap(la):
        def hook(z, hook):  # (B, T, H, d_head)
            z = z.clone()
            for (layer, h), how in replace_.items():
                if layer != la:
                    continue
                if how == "mean":
                    z[:, :, h] = z_mean[la][:, :, h].expand_as(z[:, :, h])
                    continue
                v = kept[la][:, :, h // (H // kept[la].shape[2])]  # (B, T, d_head)
                p = patterns[(la, h)]
                z[:, :, h] = torch.where(p.sum(-1, keepdim=True) > 0, p @ v, z[:, :, h])
            return z
        return hook

    hooks = [(f"blocks.{la}.attn.hook_v", keep(la)) for la in range(L)]
    hooks += [(f"blocks.{la}.attn.hook_z", swap(la)) for la in range(L)] + ([(at, keep(at))] if at else [])
    with torch.no_grad(), model.hooks(hooks):
        loss = _loss(model(batch.tokens), batch.tokens, batch.valid)
    return loss, kept.get(at)
