"""The substitution test: put a head's description back into the model and see how much of its effect it keeps.

Why it looks like this:

* **What is replaced.** A head's attention pattern becomes its description's simulated pattern (the mixture
  of its rules, :mod:`headlens.atlas.mixture`, each row summing to 1; the first token's row and padding
  stay as they are), its values and output projection as they are: at ``hook_z`` the head's output becomes
  ``pattern @ v`` with ``v`` from the same forward's ``hook_v`` (a grouped-query head reads its key/value
  group). ``hook_z`` and not ``hook_pattern``: a bridged model fires ``hook_pattern`` after it has used the
  pattern.
* **Against what.** The head's mean ablation (:class:`headlens.interventions.ablation.Replacement`, method
  ``mean``: its ``z`` averaged over the same windows at each position). The share of the head's effect the
  description keeps is ``1 - (L_subst - L_clean) / (L_mean - L_clean)`` over the next-token loss of the
  windows, pooled, with a 95 % bootstrap interval over windows: 1 when putting the description back costs
  nothing, 0 when it is no better than removing the head, negative when it is worse.
* **Cheap: receiver-local resumption, a layer at a time.** On a bridged model
  (:func:`headlens.circuits.recorded.resumable`) one clean forward records what every block was called with
  (:class:`headlens.circuits.recorded.CleanRun`), and each layer's described heads run from that layer on in
  one resumed run: per head two copies of the batch (substituted, mean-ablated), and one more with all of
  the layer's described heads substituted, as many copies per run as :data:`MAX_ROWS` token rows allow, the
  logits one copy at a time. Other backends run whole forwards (they are small). Equal to one whole hooked
  forward per head and variant (``tests/atlas/test_substitute.py``).
* **Cheaper still: most heads to first order.** Under ``subst="estimate"`` (the default) one forward and one
  backward pass estimate every head (:mod:`headlens.atlas.firstorder`) and only a sample runs as above;
  each head's ``share_how`` says which it got. ``subst="exact"`` runs every head.
* **Mean-ablated first.** A head's mean-ablated copy runs first; its substituted copy only where that moves
  the loss beyond its interval: elsewhere there is no effect for a description to keep, and a share of two
  changes lost in noise (intervals of -5 to +5 on SmolLM2's first layers) says nothing. Most of the first
  layers' heads, which always run exactly and cost the most (each runs through every later block), are such.
* **Also together.** Every described head substituted at once (the whole-model line: the loss of the model
  whose described heads all run on their descriptions), the best-described quarter, half and three quarters
  at once (:data:`BEST`, by held-out agreement: a scale to read the whole line against, since heads a
  description fixes to the tokens can no longer correct earlier heads' errors as the real ones do), and each
  layer's described heads at once (a copy in that layer's run; to first order, the sum of its heads'
  estimates, where not all of them run exactly).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from headlens.atlas.together import Substitution  # the result (re-exported: it was first defined here)

SUBST_WINDOWS = 8  # held-out windows the substitution runs on (a subsample, evenly spread)
MAX_ROWS = 16384  # token rows (copies x windows x positions) one resumed run carries: bounds its memory
NO_EFFECT = 1e-6  # a mean ablation that moves no window's loss by more than this has no share to keep
SUBST_MODES = ("estimate", "exact")  # every head estimated, a sample run exactly; or every head run exactly
BEST = (0.25, 0.5, 0.75)  # fractions of the described heads, best described first, also substituted at once

def simulated_patterns(descriptions: Sequence[Any], targets: dict[str, torch.Tensor], query_ok: torch.Tensor,
                       tokens: torch.Tensor | None = None) -> dict[tuple[int, int], torch.Tensor]:
    """``(layer, head) -> (B, Q, K)`` float32: each description's mixture of its rules' whole predictions
    (``targets[rule]``: ``(B, Q, K)`` weights, first-token fallback in rows without one), rows summing to 1
    at the ``query_ok`` rows ``(B, Q)`` (elsewhere zero: the real row stays); with ``tokens`` ``(B, K)``, a
    description's first-token share moved by the query's token (its ``query_sink``) and its keys weighted by their
    token (its ``key_pref``; both :mod:`headlens.atlas.keypref`)."""
    from headlens.atlas.rules import SINK
    from headlens.atlas.sinkbands import banded_pattern, key_weighted, query_rested

    out = {}
    for d in descriptions:
        if getattr(d, "sink_bands", ()):  # the first token's weight set per band of query positions
            p = banded_pattern(d.mixture, d.sink_bands, targets, SINK)  # (B, Q, K)
        else:
            p = sum(w * targets[r] for r, w in d.mixture.items())  # (B, Q, K)
        if tokens is not None and getattr(d, "query_sink", None):
            p = query_rested(p, tokens, _dense(d.query_sink, int(tokens.max()) + 1))
        if tokens is not None and getattr(d, "key_pref", None):
            p = key_weighted(p, tokens, _dense(d.key_pref, int(tokens.max()) + 1))
        out[(d.layer, d.head)] = (p / p.sum(-1, keepdim=True).clamp(min=1e-12) * query_ok[..., None]).float()
    return out


def _dense(pref: dict[int, float], V: int) -> torch.Tensor:
    """``(V',)``: a weight per token id (1 where ``pref`` names none), long enough for ``V`` ids and ``pref``."""
    w = torch.ones(max(V, max(pref) + 1), dtype=torch.float64)
    w[torch.tensor(list(pref))] = torch.tensor(list(pref.values()), dtype=torch.float64)
    return w


def rule_predictions(batch: Any, hits: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each rule's whole-row prediction ``(B, Q, K)`` from its target weights: spread by weight over its targets,
    on the first token in a countable row where it has none."""
    out = {}
    for name, w in hits.items():
        total = w.sum(-1, keepdim=True)  # (B, Q, 1)
        y = w / total.clamp(min=1e-300)
        y[..., 0] += ((total[..., 0] == 0) & batch.query_ok).double()
        out[name] = y
    return out


def _swap(heads: dict[int, list[tuple[int, int, Any]]], store: dict[int, torch.Tensor]) -> list[tuple[str, Any]]:
    """Hooks that keep each layer's ``hook_v`` and replace heads' ``z``: ``heads[layer]`` lists ``(head, copy,
    kind, what)``: ``kind`` ``"pattern"``, ``what`` ``(B, Q, K)`` (z becomes ``what @ v``), or ``"z"``, ``what``
    the head's new ``z`` ``(B, T, d_head)``; ``copy`` is the batch copy it applies to (rows ``copy*B ..``)."""
    def keep(layer: int) -> Any:
        def hook(v: torch.Tensor, hook: Any) -> None:  # (N, T, H_kv, d_head)
            store[layer] = v
        return hook

    def make(layer: int) -> Any:
        def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:  # (N, T, H, d_head)
            out = z.clone()
            v = store.pop(layer)
            group = z.shape[2] // v.shape[2]  # query heads per key/value head
            for h, copy, kind, what in heads[layer]:
                B = what.shape[0]
                rows = slice(copy * B, (copy + 1) * B)
                if kind == "pattern":
                    vh = v[rows, :, h // group].to(torch.float32)  # (B, T, d_head)
                    real = what.sum(-1, keepdim=True) > 0  # (B, Q, 1): rows the description predicts
                    out[rows, :, h] = torch.where(real, torch.bmm(what.to(vh), vh).to(z), z[rows, :, h])
                else:
                    out[rows, :, h] = what.to(z)
            return out
        return hook

    return ([(f"blocks.{la}.attn.hook_v", keep(la)) for la in heads]
            + [(f"blocks.{la}.attn.hook_z", make(la)) for la in heads])


def _loss(logits: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``(B,)`` float64: each window's mean next-token loss over its real positions."""
    return _mean(_nll(logits, tokens, valid), valid[:, 1:])


def _nll(logits: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``(B, T-1)`` float64: the next-token loss at each real position (0 at padding)."""
    x = logits[:, :-1].float()  # (B, T-1, V)
    nll = (torch.logsumexp(x, -1) - x.gather(-1, tokens[:, 1:, None].to(x.device))[..., 0]).double()  # (B, T-1)
    return nll * valid[:, 1:].to(nll)


def _mean(nll: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``(..., B)``: the mean of ``nll`` ``(..., B, T-1)`` over each window's ``rows`` ``(B, T-1)``."""
    m = rows.to(nll)
    return (nll * m).sum(-1) / m.sum(-1).clamp(min=1)


def suppression_rows(logits: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``(B, T-1)`` bool: the positions whose top next-token prediction is right and occurs earlier in the window
    (after its first token), where copy suppression (pushing down an earlier token the model predicts) can
    only hurt: a copy suppressor's removal lowers the loss there."""
    top = logits[:, :-1].argmax(-1).cpu()  # (B, T-1): the prediction at q, for position q + 1
    T = tokens.shape[1]
    q, k = torch.arange(T - 1)[:, None], torch.arange(T)[None, :]
    earlier = ((tokens.cpu()[:, None, :] == top[:, :, None]) & (k >= 1) & (k <= q - 1)).any(-1)  # (B, T-1)
    return earlier & (top == tokens.cpu()[:, 1:]) & valid[:, 1:].cpu()


def _share(dl_sub: torch.Tensor, dl_mean: torch.Tensor, seed: int = 0) -> tuple[float, tuple[float, float]]:
    """The share kept, pooled over windows, with its bootstrap interval (windows resampled)."""
    from headlens.scoring.stats import bootstrap_weights

    w = bootstrap_weights(dl_sub.shape[0], 400, seed).to(dl_sub)  # (n_boot, W)
    share = lambda a, b: 1 - a / torch.where(b.abs() > 1e-12, b, torch.full_like(b, 1e-12))  # noqa: E731
    boot = share(w @ dl_sub, w @ dl_mean)
    return float(share(dl_sub.sum(), dl_mean.sum())), (float(boot.quantile(0.025)), float(boot.quantile(0.975)))


def put_back(model: Any, described: list[Any], windows: list[torch.Tensor], rules: dict[str, Any],
             classes: dict[str, torch.Tensor] | None, n_windows: int) -> tuple[Any, Any, torch.Tensor, dict]:
    """What the substitution test puts back, on ``n_windows`` of ``windows`` (evenly spread): ``(batch, run,
    clean_logits, patterns)``: the windows' batch (right-padded: pads are never read), the clean run
    (:func:`_clean`), its logits ``(B, T, V)`` and each described head's simulated pattern
    (:func:`simulated_patterns`)."""
    from headlens.atlas.heldout import _batch
    from headlens.atlas.rules import causal_cells, used_targets
    from headlens.models.vocab import vocab

    n = min(n_windows, len(windows))
    batch = _batch([windows[(j * len(windows)) // n] for j in range(n)], vocab(model).special, classes)
    run, clean_logits = _clean(model, batch.tokens.to(model.device))
    hits = used_targets(rules, sorted({r for d in described for r in d.mixture}), batch, causal_cells(batch),
                        clean_logits)
    return batch, run, clean_logits, simulated_patterns(described, rule_predictions(batch, hits), batch.query_ok,
                                                        batch.tokens)


def substitute(model: Any, descriptions: list[Any], windows: list[torch.Tensor], rules: dict[str, Any],
               classes: dict[str, torch.Tensor] | None = None, n_windows: int = SUBST_WINDOWS,
               progress: Callable[[int, int], None] | None = None, max_rows: int = MAX_ROWS,
               subst: str = "estimate", n_exact: int | None = None,
               every_share: bool = False) -> tuple[list[Any], Substitution | None]:
    """Every described head's share kept (on :class:`~headlens.atlas.describe.Description`: ``share_kept``,
    ``share_ci``, ``ablation_delta``, ``subst_windows``; the mean ablation's interval in its evidence as
    ``abl_lo``, ``abl_hi``; ``share_how``: ``"exact"``, ``"estimated"``, or ``"no_effect"`` for a head run
    exactly whose mean ablation does not move the loss beyond its interval: no effect for a description to
    keep, so it is not put back, unless ``every_share``), and the whole-model
    :class:`Substitution`, on ``n_windows`` of ``windows`` (evenly spread). ``rules``: name -> detector, the
    rules the mixtures name. ``subst``: ``"exact"`` runs every head (and each layer's line) exactly;
    ``"estimate"`` estimates every head to first order (:mod:`headlens.atlas.firstorder`) and runs ``n_exact``
    of them exactly (default :data:`~headlens.atlas.firstorder.SUBST_EXACT`; where that is every head, it is
    the exact test). Every head's estimate is in its evidence (``est_subst``, ``est_abl``, ``est_share``)."""
    from headlens.atlas.describe import gate
    from headlens.atlas.firstorder import SUBST_EXACT, exact_heads, first_order
    from headlens.errors import ConfigError

    if subst not in SUBST_MODES:
        raise ConfigError(f"subst={subst!r} is not a substitution mode; expected one of {', '.join(SUBST_MODES)}")
    described = [d for d in descriptions if d.described and d.mixture]
    if not described or not windows or n_windows < 1:
        return descriptions, None
    batch, run, clean_logits, patterns = put_back(model, described, windows, rules, classes, n_windows)
    tokens, B, T = batch.tokens.to(model.device), batch.tokens.shape[0], batch.tokens.shape[1]
    valid = batch.valid
    clean_nll = _nll(clean_logits, batch.tokens, valid).cpu()  # (B, T-1)
    cs_rows = suppression_rows(clean_logits, batch.tokens, valid)  # (B, T-1)
    del clean_logits
    clean = _mean(clean_nll, valid[:, 1:])  # (B,)
    est_sub, est_abl, mean = first_order(
        model, tokens, lambda lg, rows: _loss(lg, tokens[rows], valid[rows].to(lg.device)).sum(), patterns, None)
    exact = (dict.fromkeys(patterns, "all") if subst == "exact" else
             exact_heads(described, est_sub, est_abl, SUBST_EXACT if n_exact is None else n_exact))
    layers = sorted({d.layer for d in described})
    # a layer whose described heads all run exactly runs its line exactly too (two more copies in the same run):
    # the first layers' always, where first-order sums are furthest off; every layer under subst="exact"
    whole = {la for la in layers if all((d.layer, d.head) in exact for d in described if d.layer == la)}
    z_zero = torch.zeros(B, T, 1, 1, device=tokens.device)
    # (layer, head) -> (substituted (B, T-1) or None, mean-ablated (B, T-1), its loss changes (B,), their interval)
    nlls: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, tuple[float, float]]] = {}
    per_layer, per_layer_mean, layer_how, done, total = {}, {}, {}, 1, len(exact) + 2
    if progress is not None:
        progress(done, total)
    for layer in layers:
        mine = [d for d in described if d.layer == layer and (d.layer, d.head) in exact]
        z_mean = mean.z(layer, z_zero)  # (B, T, H, d_head)
        n_h, lines = len(mine), layer in whole
        put = [[(d.head, "pattern", patterns[(layer, d.head)])] for d in mine]
        copies = [[(d.head, "z", z_mean[:, :, d.head])] for d in mine]  # mean-ablated first
        if lines:
            copies += [[c[0] for c in put], [c[0] for c in copies]]  # the layer's heads at once
        nll = _copies(model, run, tokens, batch, layer, copies, max_rows) if copies else None  # (n(+2), B, T-1)
        dmeans = [_mean(nll[j], valid[:, 1:]) - clean for j in range(n_h)]  # (B,) each
        cis = [_mean_ci(dm) for dm in dmeans]
        # put back where the mean ablation leaves an effect to keep (its interval clear of 0), or every head
        back = [j for j in range(n_h) if every_share or (float(dmeans[j].abs().max()) > NO_EFFECT
                                                         and (cis[j][0] > 0 or cis[j][1] < 0))]
        sub = dict(zip(back, _copies(model, run, tokens, batch, layer, [put[j] for j in back], max_rows),
                       strict=True)) if back else {}
        for j, d in enumerate(mine):
            nlls[(layer, d.head)] = (sub.get(j), nll[j], dmeans[j], cis[j])
        keys = [(d.layer, d.head) for d in described if d.layer == layer]
        layer_how[layer] = "exact" if lines else "estimated"
        if lines:
            per_layer[layer] = (n_h, float(_mean(nll[n_h], valid[:, 1:]).mean()))
            per_layer_mean[layer] = float(_mean(nll[n_h + 1], valid[:, 1:]).mean())
        else:  # to first order the layer's heads at once move the loss by the sum of their estimates
            per_layer[layer] = (len(keys), float(clean.mean() + sum(est_sub[k] for k in keys).mean()))
            per_layer_mean[layer] = float(clean.mean() + sum(est_abl[k] for k in keys).mean())
        done += n_h
        if progress is not None and n_h:
            progress(done, total)
    out = []
    for d in descriptions:
        at = (d.layer, d.head)
        if at not in patterns:
            out.append(d)
            continue
        es, ea = est_sub[at], est_abl[at]
        est = {"est_subst": float(es.mean()), "est_abl": float(ea.mean()),
               "est_share": _share(es, ea)[0] if float(ea.abs().max()) > NO_EFFECT else float("nan")}
        if at not in nlls:  # not put back: its share kept is not measured (the estimate stays in the evidence,
            # a hint only: a ratio of two first-order changes, within 0.1 of the exact share for few of SmolLM2's heads)
            out.append(replace(d, share_kept=None, share_ci=None, ablation_delta=est["est_abl"], subst_windows=B,
                               evidence={**d.evidence, **est, "share_how": "estimated"}))
            continue
        nsub, nmean, dmean, a_ci = nlls[at]
        ev = {**d.evidence, "abl_lo": a_ci[0], "abl_hi": a_ci[1], **_on_rows(nmean - clean_nll, cs_rows), **est,
              "exact_pick": exact[at]}
        if nsub is None:  # no effect to keep: not put back
            ev.pop("subst_delta", None)  # (from an earlier test of the same description)
            out.append(gate(replace(d, share_kept=None, share_ci=None, ablation_delta=float(dmean.mean()),
                                    subst_windows=B, evidence={**ev, "share_how": "no_effect"})))
            continue
        dsub = _mean(nsub, valid[:, 1:]) - clean  # (B,)
        share, ci = _share(dsub, dmean) if float(dmean.abs().max()) > NO_EFFECT else (None, None)
        ev = {**ev, "subst_delta": float(dsub.mean()), "share_how": "exact"}
        out.append(gate(replace(d, share_kept=share, share_ci=ci, ablation_delta=float(dmean.mean()),
                                subst_windows=B, evidence=ev)))
    # every described head at once (copy 0), and the best-described fractions (by held-out agreement) at once
    ranked = sorted(described, key=lambda d: (-d.agreement, d.layer, d.head))
    sizes = [max(1, round(f * len(ranked))) for f in BEST]
    heads_all: dict[int, list] = {}
    for copy, n in enumerate([len(ranked), *sizes]):
        for d in ranked[:n]:
            heads_all.setdefault(d.layer, []).append((d.head, copy, "pattern", patterns[(d.layer, d.head)]))
    at_once = _mean(_run(model, run, tokens, batch, heads_all, 1 + len(sizes), None), valid[:, 1:])  # (1+F, B)
    every = at_once[0]
    lo, hi = _mean_ci(every)
    if progress is not None:
        progress(total, total)
    return out, Substitution(float(clean.mean()), float(every.mean()), (lo, hi), len(described), B, per_layer,
                             per_layer_mean, "exact" if whole == set(layers) else "estimated", len(exact), layer_how,
                             [(f, n, float(v.mean())) for f, n, v in zip(BEST, sizes, at_once[1:], strict=True)])


def _on_rows(delta: torch.Tensor, rows: torch.Tensor, seed: int = 0) -> dict[str, float]:
    """The mean ablation's loss change ``delta`` ``(B, T-1)`` pooled over ``rows`` (:func:`suppression_rows`)
    with its bootstrap interval over windows: ``cs_delta``, ``cs_lo``, ``cs_hi``, ``cs_rows``."""
    from headlens.scoring.stats import bootstrap_weights

    m = rows.to(delta)
    s, n = (delta * m).sum(1), m.sum(1)  # (B,) each
    if float(n.sum()) == 0:
        return {"cs_delta": float("nan"), "cs_lo": float("nan"), "cs_hi": float("nan"), "cs_rows": 0.0}
    w = bootstrap_weights(s.shape[0], 400, seed).to(s)  # (n_boot, B)
    boot = (w @ s) / (w @ n).clamp(min=1)
    return {"cs_delta": float(s.sum() / n.sum()), "cs_lo": float(boot.quantile(0.025)),
            "cs_hi": float(boot.quantile(0.975)), "cs_rows": float(n.sum())}


def _copies(model: Any, run: Any, tokens: torch.Tensor, batch: Any, layer: int, copies: list[list[tuple]],
            max_rows: int) -> torch.Tensor:
    """``(len(copies), B, T-1)`` per-position losses: each copy a list of ``(head, kind, what)`` replacements at ``layer``
    (:func:`_swap`), as many copies of the batch per resumed run as ``max_rows`` token rows allow."""
    B, T = tokens.shape
    per = max(1, max_rows // (B * T))
    out = []
    for i in range(0, len(copies), per):
        chunk = copies[i:i + per]
        heads = {layer: [(h, j, kind, what) for j, copy in enumerate(chunk) for h, kind, what in copy]}
        out.append(_run(model, run, tokens, batch, heads, len(chunk), layer))
    return torch.cat(out)


def _mean_ci(v: torch.Tensor, seed: int = 0) -> tuple[float, float]:
    from headlens.scoring.stats import bootstrap_weights

    w = bootstrap_weights(v.shape[0], 400, seed).to(v)
    boot = (w @ v) / w.sum(1)
    return float(boot.quantile(0.025)), float(boot.quantile(0.975))


def _clean(model: Any, tokens: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """The clean forward: a :class:`~headlens.circuits.recorded.CleanRun` on a bridged model (None elsewhere), and
    the logits ``(B, T, V)``."""
    from headlens.circuits.recorded import CleanRun, resumable
    from headlens.interventions.task import Task

    if resumable(model):
        run = CleanRun(model, Task(tokens, torch.ones_like(tokens, dtype=torch.bool)))
        return run, run.logits
    with torch.no_grad():
        return None, model(tokens)


def _run(model: Any, run: Any, tokens: torch.Tensor, batch: Any, heads: dict[int, list], K: int,
         start: int | None) -> torch.Tensor:
    """``(K, B, T-1)`` per-position losses (:func:`_nll`) with ``heads`` replaced (:func:`_swap`), ``K`` copies of
    the batch; from block ``start`` on a bridged model (the clean residual stream entering it, the logits one
    copy at a time: ``(B, T, V)`` is the largest tensor of a run), else a whole forward."""
    B = tokens.shape[0]
    valid = batch.valid.to(tokens.device)
    store: dict[int, torch.Tensor] = {}
    hooks = _swap(heads, store)
    with torch.no_grad(), model.hooks(hooks):
        if run is None:
            logits = model(tokens.repeat(K, 1))  # (K*B, T, V)
            return _nll(logits, tokens.repeat(K, 1), valid.repeat(K, 1)).view(K, B, -1).cpu()
        layer0 = min(heads) if start is None else start
        x = run.calls[layer0][0][0].repeat(K, 1, 1)  # (K*B, T, D): the clean stream entering it
        for layer in range(layer0, len(model.bridge.blocks)):
            x = run.block(model, layer, x, K)
        b = model.bridge
        transform = getattr(getattr(b, "adapter", None), "apply_output_logits_transform", None)
        out = []
        for k in range(K):
            logits = b.unembed(b.ln_final(x[k * B:(k + 1) * B]))  # (B, T, V)
            out.append(_nll(logits if transform is None else transform(logits), tokens, valid))
    return torch.stack(out).cpu()  # (K, B, T-1)
