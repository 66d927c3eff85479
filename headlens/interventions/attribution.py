"""Attribution patching: a first-order estimate of every head's ablation effect from one
forward and one backward pass.

For a metric ``M`` and a head with clean output ``z`` and replacement ``z'`` (zeros, mean or
resampled), ``M(z') - M(z) ≈ <∂M/∂z, z' - z>`` (Nanda 2023; Syed et al. 2023). The gradient
with respect to every head's ``z`` comes from a single backward pass, so the estimate for all
heads costs about three forward passes, against one forward per head for exact ablation.

Gradients are taken with respect to a zero tensor added at each ``hook_z`` (the total
derivative, through later layers too), so the model's own ``.grad`` fields are never touched
and frozen weights are fine. Metrics that are not differentiable use a smooth surrogate
(``bracket_accuracy``: probability of the right closer among the closers). ``kl`` is at its
minimum on the clean run, so its first-order estimate is identically zero: NaN is returned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch

from headlens.interventions.ablation import Replacement, live_hooks
from headlens.interventions.logits import logit_rows, logits_at, read_columns
from headlens.interventions.metrics import SURROGATES, Task, get_metric, per_prompt_mean


def attribution_patching(model: Any, task: Task, metric: str, replacement: Replacement) -> torch.Tensor:
    """Estimated per-prompt change of ``metric`` when each single head is ablated.

    Args:
        model: any headlens backend.
        task: probe tokens and scored positions (from ``headlens.interventions.metrics.make_task``).
        metric: a registered metric name.
        replacement: what an ablated head's ``z`` becomes (built for every layer).

    Returns:
        ``(n_prompts, n_layers, n_heads)`` float64 estimates of ``ablated - clean``.
    """
    m = get_metric(metric)
    B, L, H = task.n_prompts, model.n_layers, model.n_heads
    if m.needs_clean:
        return torch.full((B, L, H), float("nan"), dtype=torch.float64)
    value = SURROGATES.get(metric, m.value)
    at = task.at(read_columns(task.positions))  # logits and their gradients at the read positions only
    # a backward keeps the logits, their log-softmax and their gradient: a quarter of the forward's budget each
    rows = B if replacement.method == "resample" else logit_rows(model, len(at.columns()), parts=4)
    out = torch.empty(B, L, H, dtype=torch.float64)
    for i in range(0, B, rows):  # prompts are independent: a chunk's gradients are the whole batch's rows
        out[i:i + rows] = _estimates(model, at.rows(slice(i, i + rows)), value, replacement)
    return out


def _estimates(model: Any, task: Task, value: Any, replacement: Replacement) -> torch.Tensor:
    """``(b, n_layers, n_heads)`` estimates for the prompts of ``task`` (read at ``task.cols``), one backward."""
    L = model.n_layers
    live: dict[int, dict[str, torch.Tensor]] = {}
    fwd = live_hooks(range(L), live, replacement) if replacement.needs_live else []

    def total() -> torch.Tensor:
        logits = logits_at(model, task.tokens, task.cols, task.attention_mask)  # (b, C, V)
        return per_prompt_mean(value(logits, task, None), task.read()).sum()

    clean_z, grads = z_gradients(model, total, range(L), fwd)
    out = torch.empty(task.n_prompts, L, model.n_heads, dtype=torch.float64)
    for layer in range(L):
        dz = replacement.z(layer, clean_z[layer], live.get(layer)) - clean_z[layer]  # (b, T, H, d_head)
        out[:, layer] = (dz * grads[layer]).sum((1, 3)).double().cpu()  # (b, H): summed over positions and d_head
    return out


def z_gradients(model: Any, total: Callable[[], torch.Tensor], layers: Iterable[int],
                hooks: Sequence[tuple[str, Any]] = ()) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    """Each of ``layers``' clean ``hook_z`` ``(B, T, H, d_head)`` (detached) and the gradient of ``total()`` (a
    scalar from a forward of ``model`` it runs) with respect to it, from one backward pass: the total derivative,
    through later layers too (a zero tensor added at each ``hook_z``, so the model's own ``.grad`` fields are
    never touched and frozen weights are fine). ``hooks``: more forward hooks, installed first."""
    layers = list(layers)
    leaves: dict[int, torch.Tensor] = {}
    clean_z: dict[int, torch.Tensor] = {}

    def make(layer: int) -> Any:
        def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:  # z: (B, T, H, d_head)
            clean_z[layer] = z.detach()
            leaves[layer] = torch.zeros_like(z, requires_grad=True)
            return z + leaves[layer]

        return hook

    fwd = list(hooks) + [(f"blocks.{layer}.attn.hook_z", make(layer)) for layer in layers]
    with torch.enable_grad(), model.hooks(fwd):
        grads = torch.autograd.grad(total(), [leaves[layer] for layer in layers])
    return clean_z, dict(zip(layers, grads, strict=True))


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation (average ranks for ties); NaN when either side is constant or NaN."""
    import pandas as pd

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 2 or np.isnan(a).any() or np.isnan(b).any():
        return float("nan")
    ra, rb = pd.Series(a).rank().to_numpy(), pd.Series(b).rank().to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])
