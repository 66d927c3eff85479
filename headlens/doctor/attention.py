"""``check_attention``: does a user's attention module compute multi-head attention, and if not, which bug?

How: copy the module's projection weights into headlens' reference attention
(``headlens.models.gpt.MultiHeadAttention`` for causal attention), run both on the same random
input in float64, and compare. When they differ, re-run the reference with each known bug
injected (``headlens.doctor.bugs``); the one that reproduces the module's output is the
diagnosis. Independently, three invariants every correct multi-head attention satisfies are
probed on the module itself: causality, equivariance under a permutation of heads, and
single-head isolation.

The inputs are scaled so that attention scores have a standard deviation of about 2: with
tiny scores every pattern is near-uniform and several bugs would look alike.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable

import torch
from torch import nn

from headlens.doctor.bugs import AttentionRecipe, Bug, apply_bug, known_bugs, reference_attention
from headlens.doctor.layouts import Layout, find_layout
from headlens.doctor.report import AttentionReport, Evidence, ProbeResult
from headlens.errors import ConfigError
from headlens.models.config import ModelConfig
from headlens.models.gpt import MultiHeadAttention

Caller = Callable[[nn.Module, torch.Tensor], torch.Tensor]


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b|, counting positions where both are NaN as equal and where one is as inf."""
    both_nan = torch.isnan(a) & torch.isnan(b)
    d = (a - b).abs().masked_fill(both_nan, 0.0).nan_to_num(nan=math.inf)
    return float(d.max()) if d.numel() else 0.0


def _pick_length(n_heads: int, d_head: int) -> int:
    return next(t for t in (7, 11, 13, 17) if t not in (n_heads, d_head))


def _input(w_qkv: torch.Tensor, b_qkv: torch.Tensor, d_model: int, n_heads: int, batch: int, T: int,
           seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Random (B, T, D) input scaled so the reference's scores have std ~2 (patterns neither flat nor one-hot)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, T, d_model, generator=g, dtype=dtype)
    scale = 1.0
    for _ in range(3):  # scores are ~quadratic in the input scale
        q, k, _ = nn.functional.linear(x * scale, w_qkv, b_qkv).split(d_model, dim=2)
        d_head = d_model // n_heads
        q = q.view(batch, T, n_heads, d_head).transpose(1, 2)  # (B, H, T, d_head)
        k = k.view(batch, T, n_heads, d_head).transpose(1, 2)  # (B, H, T, d_head)
        std = float((q @ k.transpose(-2, -1)).std()) / math.sqrt(d_head)
        if not math.isfinite(std) or std == 0:
            break
        scale *= min(max(math.sqrt(2.0 / std), 0.1), 10.0)
    return x * scale


def _reference(weights: tuple[torch.Tensor, ...], x: torch.Tensor, n_heads: int, causal: bool) -> torch.Tensor:
    """The correct output: headlens' own MultiHeadAttention when causal, the bug-free recipe otherwise."""
    w_qkv, b_qkv, w_o, b_o = weights
    _, T, D = x.shape
    if not causal:
        return reference_attention(x, *weights, AttentionRecipe(n_heads=n_heads, mask="none"))
    mha = MultiHeadAttention(ModelConfig(n_layers=1, n_heads=n_heads, d_model=D, n_ctx=T, d_vocab=1))
    mha = mha.to(device=x.device, dtype=x.dtype)
    with torch.no_grad():
        mha.c_attn.weight.copy_(w_qkv)
        mha.c_attn.bias.copy_(b_qkv)
        mha.c_proj.weight.copy_(w_o)
        mha.c_proj.bias.copy_(b_o)
        return mha(x)


def _candidates(bugs: list[Bug], base: AttentionRecipe, pairs: bool) -> list[tuple[str, str, AttentionRecipe]]:
    singles = [(b, label, ov) for b in bugs for label, ov in b.variants]
    if not pairs:
        return [(b.name, label, apply_bug(base, ov)) for b, label, ov in singles]
    out = []
    for (b1, l1, o1), (b2, l2, o2) in itertools.combinations(singles, 2):
        if b1.name != b2.name and not set(o1) & set(o2):
            out.append((f"{b1.name}+{b2.name}", f"{l1}; {l2}", apply_bug(base, {**o1, **o2})))
    return out


def _diagnose(user: torch.Tensor, x: torch.Tensor, weights: tuple[torch.Tensor, ...], bugs: list[Bug],
              base: AttentionRecipe, tol: float) -> list[Evidence]:
    """Evidence for every single bug; for every pair of bugs as well when no single one reproduces."""
    rows: list[Evidence] = []
    for pairs in (False, True):
        for name, label, recipe in _candidates(bugs, base, pairs):
            with torch.no_grad():
                try:
                    out = reference_attention(x, *weights, recipe)
                except RuntimeError:  # e.g. a head count the weights cannot be viewed as
                    continue
            d = _max_diff(user, out)
            rows.append(Evidence(name, label, d, d <= tol))
        if any(r.matches for r in rows):
            break
    return sorted(rows, key=lambda r: (not r.matches, r.max_abs_diff))


def _head_blocks(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    return w.view(n_heads, -1, *w.shape[1:])  # (H, d_head, ...): rows of one q/k/v block, per head


def _permute_heads(weights: tuple[torch.Tensor, ...], perm: torch.Tensor, n_heads: int) -> tuple[torch.Tensor, ...]:
    w_qkv, b_qkv, w_o, b_o = weights
    D = w_o.shape[0]
    w_new = torch.cat([_head_blocks(w, n_heads)[perm].reshape(D, D) for w in w_qkv.split(D)])
    b_new = torch.cat([_head_blocks(b, n_heads)[perm].reshape(D) for b in b_qkv.split(D)])
    w_o_new = w_o.view(D, n_heads, D // n_heads)[:, perm].reshape(D, D)  # (D, H, d_head) columns permuted
    return w_new, b_new, w_o_new, b_o


def _probes(subject: nn.Module, layout: Layout, call: Caller, x: torch.Tensor, user: torch.Tensor,
            weights: tuple[torch.Tensor, ...], n_heads: int, causal: bool, tol: float) -> list[ProbeResult]:
    results = []
    _, T, D = x.shape
    d_head = D // n_heads
    with torch.no_grad():
        if causal:
            j = T // 2
            x2 = x.clone()
            noise = torch.randn(x2[:, j:].shape, generator=torch.Generator().manual_seed(1), dtype=x.dtype)
            x2[:, j:] += noise.to(x.device)
            change = _max_diff(call(subject, x2)[:, :j], user[:, :j])
            results.append(ProbeResult("causality", change <= tol, change,
                                       f"changing positions >= {j} must not change outputs at positions < {j}"))
        if n_heads > 1:
            perm = torch.roll(torch.arange(n_heads, device=x.device), 1)
            layout.set_weights(*_permute_heads(weights, perm, n_heads))
            change = _max_diff(call(subject, x), user)
            layout.set_weights(*weights)
            results.append(ProbeResult("head_permutation", change <= tol, change,
                                       "moving whole heads (q/k/v rows with their out columns) must not change the output"))
        w_qkv, b_qkv, w_o, b_o = weights
        _, merged = reference_attention(x, *weights, AttentionRecipe(n_heads=n_heads, mask="causal" if causal else "none"),
                                        return_z=True)
        worst = 0.0
        for h in range(n_heads):
            keep = torch.zeros(D, dtype=torch.bool, device=x.device)
            keep[h * d_head:(h + 1) * d_head] = True
            layout.set_weights(w_qkv, b_qkv, w_o * keep, b_o)
            expected = nn.functional.linear(merged * keep, w_o, b_o)  # that head's term alone
            worst = max(worst, _max_diff(call(subject, x), expected))
        layout.set_weights(*weights)
        results.append(ProbeResult("single_head_isolation", worst <= tol, worst,
                                   "zeroing every head's out columns but one must leave exactly that head's term"))
    return results


def check_attention(
    module: nn.Module,
    d_model: int,
    n_heads: int,
    causal: bool = True,
    call: Caller | None = None,
    seed: int = 0,
    batch: int = 2,
) -> AttentionReport:
    """Check that ``module`` computes standard multi-head self-attention; name the bug when it does not.

    The module is deep-copied (the original is never modified) and run in eval mode, in float64
    when it can be. See ``headlens.doctor.layouts`` for the accepted layouts.

    Args:
        module: maps ``(B, T, d_model)`` to ``(B, T, d_model)`` (``nn.MultiheadAttention`` is called
            as ``mha(x, x, x, attn_mask=causal mask)``, transposed for ``batch_first=False``).
        d_model: residual width.
        n_heads: the head count the module is meant to use.
        causal: whether each position should see only itself and earlier positions.
        call: optional ``call(module, x) -> y`` for modules with an unusual signature.
        seed: seed of the random input.
        batch: batch size of the random input.

    Returns:
        An :class:`AttentionReport`; ``report.passed`` is False when the output differs from the
        reference or an invariant probe fails, and ``report.diagnosis`` names the bug.

    >>> mha = nn.MultiheadAttention(32, 4, batch_first=True)
    >>> check_attention(mha, d_model=32, n_heads=4).passed
    True
    """
    if d_model <= 0 or n_heads <= 0 or d_model % n_heads:
        raise ConfigError(f"d_model={d_model} must be a positive multiple of n_heads={n_heads}")
    subject = copy.deepcopy(module).eval()
    dtype = torch.float64
    try:
        subject = subject.double()
    except Exception:  # a module that refuses float64 is checked in its own dtype
        dtype = next((p.dtype for p in subject.parameters()), torch.float32)
    layout = find_layout(subject, d_model, causal)
    run = call or layout.call
    weights = layout.weights()
    T = _pick_length(n_heads, d_model // n_heads)
    x = _input(weights[0].cpu(), weights[1].cpu(), d_model, n_heads, batch, T, seed, dtype).to(weights[0].device)
    with torch.no_grad():
        ref = _reference(weights, x, n_heads, causal)
        try:
            user = run(subject, x)
        except Exception as err:  # a crash is not silent, but say so in one line
            raise ConfigError(f"{type(module).__name__} raised on input of shape {tuple(x.shape)}: "
                              f"{type(err).__name__}: {err}") from None
    if tuple(user.shape) != tuple(x.shape):
        raise ConfigError(f"module returned shape {tuple(user.shape)} for input {tuple(x.shape)}; "
                          f"expected (B, T, d_model) back")
    rtol = 1e-9 if dtype == torch.float64 else 1e-5
    tol = rtol * 100 * max(1.0, float(ref.abs().max()))
    diff = _max_diff(user, ref)
    base = AttentionRecipe(n_heads=n_heads, mask="causal" if causal else "none")
    bugs = known_bugs(d_model, n_heads, causal)
    evidence = [Evidence("correct", "reference multi-head attention", diff, diff <= tol)]
    if diff > tol:
        evidence = _diagnose(user, x, weights, bugs, base, tol) + evidence
    probes = _probes(subject, layout, run, x, user, weights, n_heads, causal, tol)
    passed = diff <= tol and all(p.passed for p in probes)
    settings = dict(d_model=d_model, n_heads=n_heads, causal=causal, input_shape=list(x.shape), dtype=str(dtype),
                    seed=seed, input_scale=float(x.std()))
    diagnosis, title, variant = _verdict(passed, diff > tol, evidence[0], bugs, n_heads, settings)
    return AttentionReport(passed, diagnosis, title, variant, layout.description, diff, tol, evidence, probes,
                           settings)


def _verdict(passed: bool, differs: bool, best: Evidence, bugs: list[Bug], n_heads: int,
             settings: dict) -> tuple[str | None, str, str]:
    """(diagnosis, title, variant) from the closest evidence; adds the bug's typical line to settings."""
    if passed:
        return None, "no problem found", ""
    if best.matches and best.bug != "correct":
        by_name = {b.name: b for b in bugs}
        parts = [by_name[n] for n in best.bug.split("+")]
        title = " AND ".join(b.title for b in parts)
        if best.bug == "wrong_head_count":
            title += f" (the module computes {best.variant}; expected n_heads={n_heads})"
        settings["looks_like"] = " | ".join(b.looks_like for b in parts)
        return best.bug, title, best.variant
    if differs:
        return None, ("output differs from multi-head attention and no known bug reproduces it "
                      f"(closest: {best.bug}, max |diff| {best.max_abs_diff:.3g})"), ""
    return None, "output matches the reference here but an invariant probe fails", ""
