"""Edge attribution patching (EAP): a first-order estimate of every edge's effect from one forward and one
backward pass, to rank discovery's candidates before the exact patching that reports them.

For edge ``S -> R.c`` (receiver head ``h`` of layer ``l``, input ``c`` of q/k/v) the exact patch moves the
residual stream that ``R.c`` reads from ``x`` to ``x + delta_S``. To first order the metric changes by

    ``sum_t < delta_S[t], J_LN(x[t])^T W_{c,h}^T g_{c,h}[t] >``,   ``g_{c,h} = dM / d(hook_c)[:, :, h]``

(Syed et al. 2023, "Attribution patching outperforms automated circuit discovery"). The gradients of every
head's q, k and v come from one backward pass (zero tensors added at ``hook_q|k|v``, so the model's own
``.grad`` fields are untouched); LayerNorm's transposed Jacobian is applied in closed form,
``J^T w = (gamma w - mean(gamma w) - x_hat mean(gamma w x_hat)) / sigma``. Logits receivers read the final
residual stream: their gradient is the one at the last block's ``hook_resid_post``.

Native models and bridged GPT-2s (through their native twin) by this formula; other Hugging Face families
through the bridge's per-head q/k/v input forks (:func:`_bridge_attribution`). ``kl`` sits at its minimum on the clean
run, so its first-order estimate is zero everywhere: no first pass for it. A metric that is not
differentiable uses the smooth surrogate the head attribution uses (``interventions.metrics.SURROGATES``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from headlens.circuits.nodes import INPUTS, Edge
from headlens.interventions.metrics import SURROGATES, Task, get_metric, per_prompt_mean


def native_of(model: Any) -> Any:
    """The native GPT the first pass differentiates: the model itself, a bridged GPT-2's twin, or None."""
    from headlens.circuits.twin import native_twin
    from headlens.models.gpt import GPT

    return model if isinstance(model, GPT) else native_twin(model)


def supported(model: Any, metric: str) -> str | None:
    """None when the first pass can rank edges of ``model`` on ``metric``, else why not (one line)."""
    if get_metric(metric).needs_clean:
        return f"{metric} is at its minimum on the clean run: its first-order estimate is zero"
    if native_of(model) is None:
        from headlens.circuits.bridge import has_forks

        if not (hasattr(model, "bridge") and has_forks(model)):
            return "edge attribution needs a native model or a bridge with per-head q/k/v input forks"
    return None


def _ln_vjp(norm: torch.nn.Module, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``J_norm(x)^T w`` for ``w`` ``(..., B, T, D)`` at ``x`` ``(B, T, D)``: LayerNorm in closed form, Identity as is."""
    if not isinstance(norm, torch.nn.LayerNorm):
        return w
    mu = x.mean(-1, keepdim=True)
    sigma = (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
    x_hat = (x - mu) / sigma  # (B, T, D)
    gw = w * norm.weight  # (..., B, T, D)
    return (gw - gw.mean(-1, keepdim=True) - x_hat * (gw * x_hat).mean(-1, keepdim=True)) / sigma


def edge_attribution(model: Any, task: Task, metric: str, edges: Sequence[Edge], deltas: Any) -> dict[Edge, np.ndarray]:
    """Per-prompt first-order estimates ``(B,)`` of each edge's effect (``metric(patched) - metric(clean)``)."""
    why = supported(model, metric)
    if why is not None:
        raise ValueError(why)
    gpt = native_of(model)
    value = SURROGATES.get(metric, get_metric(metric).value)
    if gpt is None:
        return _bridge_attribution(model, task, value, edges, deltas)
    L = gpt.cfg.n_layers
    layers = sorted({e.receiver.layer for e in edges if e.receiver.kind == "head"})
    final = f"blocks.{L - 1}.hook_resid_post"
    leaves: dict[str, torch.Tensor] = {}
    seen: dict[str, torch.Tensor] = {}

    def leaf(x: torch.Tensor, hook: Any) -> torch.Tensor:
        leaves[hook.name] = torch.zeros_like(x, requires_grad=True)
        return x + leaves[hook.name]

    def keep(x: torch.Tensor, hook: Any) -> None:
        seen[hook.name] = x.detach()

    fwd = [(f"blocks.{layer}.attn.hook_{c}", leaf) for layer in layers for c in INPUTS]
    fwd += [(f"blocks.{layer}.hook_resid_pre", keep) for layer in layers] + [(final, leaf)]
    with torch.enable_grad(), gpt.hooks(fwd):
        logits = gpt(task.tokens, attention_mask=task.attention_mask)
        total = per_prompt_mean(value(logits, task, None), task.positions).sum()
        names = list(leaves)
        grads = dict(zip(names, torch.autograd.grad(total, [leaves[n] for n in names]), strict=True))

    reads: dict[tuple[int, str], torch.Tensor] = {}  # (layer, c) -> (H, B, T, D): what each head's input c reads
    H, d = gpt.cfg.n_heads, gpt.cfg.d_head
    for layer in layers:
        block = gpt.transformer.h[layer]
        x = seen[f"blocks.{layer}.hook_resid_pre"]  # (B, T, D)
        w = block.attn.c_attn.weight.detach().view(3, H, d, -1)  # (qkv, H, d_head, D): rows are q, k, v then heads
        for i, c in enumerate(INPUTS):
            g = grads[f"blocks.{layer}.attn.hook_{c}"]  # (B, T, H, d_head)
            u = torch.einsum("bthd,hdD->hbtD", g, w[i])  # (H, B, T, D): gradient at the normed input
            reads[layer, c] = _ln_vjp(block.ln_1, x, u)
    g_final = grads[final]  # (B, T, D): the logits read the final residual stream, through ln_f

    result: dict[Edge, np.ndarray] = {}
    for e in edges:
        delta = deltas.delta(e.sender).to(g_final)  # (B, T, D)
        r = e.receiver
        grad = g_final if r.kind == "logits" else reads[r.layer, e.input][r.head]  # (B, T, D)
        result[e] = (delta * grad).sum((1, 2)).detach().double().cpu().numpy()  # (B,)
    return result


def _bridge_attribution(model: Any, task: Task, value: Any, edges: Sequence[Edge], deltas: Any) -> dict[Edge, np.ndarray]:
    """The same estimate through the bridge's forks: each head's pre-norm copy of the residual stream
    (``hook_{c}_input`` ``(B, T, H or H_kv, D)``) is exactly what that input reads, so its gradient already
    carries the family's norm, rotary embedding and soft-cap. Under grouped-query attention a key/value copy
    is its group's: a per-query-head k/v edge is ranked by its group's estimate."""
    from headlens.circuits.bridge import forks
    from headlens.circuits.nodes import kv_head
    from headlens.interventions.sweep import task_logits

    L = model.cfg.n_layers
    layers = sorted({e.receiver.layer for e in edges if e.receiver.kind == "head"})
    final = f"blocks.{L - 1}.hook_resid_post"
    leaves: dict[str, torch.Tensor] = {}

    def leaf(x: torch.Tensor, hook: Any) -> torch.Tensor:
        leaves[hook.name] = torch.zeros_like(x, requires_grad=True)
        return x + leaves[hook.name]

    fwd = [(f"blocks.{layer}.attn.hook_{c}_input", leaf) for layer in layers for c in INPUTS] + [(final, leaf)]
    with torch.enable_grad(), forks(model), model.hooks(fwd):
        logits = task_logits(model, task, 0)  # (B, T, V)
        total = per_prompt_mean(value(logits, task, None), task.positions).sum()
        names = list(leaves)
        grads = dict(zip(names, torch.autograd.grad(total, [leaves[n] for n in names]), strict=True))
    result: dict[Edge, np.ndarray] = {}
    for e in edges:
        r = e.receiver
        if r.kind == "logits":
            grad = grads[final]  # (B, T, D)
        else:
            idx = r.head if e.input == "q" else kv_head(model, r.head)
            grad = grads[f"blocks.{r.layer}.attn.hook_{e.input}_input"][:, :, idx]  # (B, T, D)
        delta = deltas.delta(e.sender).to(grad)  # (B, T, D)
        result[e] = (delta * grad).sum((1, 2)).detach().double().cpu().numpy()  # (B,)
    return result
