"""Which key tokens a head prefers among the keys its description spreads a row over: a weight per key token.

Why it looks like this:

* **Where the rest of a row goes.** A description (:mod:`headlens.atlas.describe`) says how much of a row
  rests on the first token and spreads the rest by position-led rules (``uniform``, ``decay_8``, ...), but
  a real head spreads it by what the keys hold: put back with the head's own spread over the other keys,
  SmolLM2's descriptions would write 5x closer to what the heads write (benchmarks/README.md). The part a
  reader can state and a simulation can put back from the tokens alone is a weight per key token: "among
  those keys, ``,`` weighs 3.1x, `` the`` 0.4x". The description's pattern ``p`` becomes, in every row,
  the first token's cell as it is and the other cells ``p[q, k] * w[x_k]``, renormalised to the row's
  same mass off the first token (:func:`headlens.atlas.sinkbands.key_weighted`).
* **Fit, gated and scored on three sets of windows.** Each head's share on the first token first gets an odds
  factor per query token (:mod:`headlens.atlas.querysink`), then the key weights are fit on top of it by
  proportional fitting, both on every other fit window: :data:`ITERS` steps of ``w_v <- w_v (A_v + PRIOR) /
  (P_v + PRIOR)``, ``A_v`` the head's attention off the first token on keys holding token ``v`` and ``P_v`` its
  weighted description's (``PRIOR`` shrinks a rare token to 1; the rules read the tokens alone, so the steps
  need no forward), over the :data:`TOP` tokens with the most attention (every other token weighs 1: a short
  list to read). On the other fit windows, each is kept where it cuts an error by
  :data:`headlens.atlas.mixture.MIN_DROP` or more (as a rule must to join a mixture): the query factors the
  squared error of whole rows (they move the first token's cell and scale the others); the key weights, on top
  of the query factors where those are kept, the squared error over the cells off the first token (the only
  ones they change: the first token's cell, the largest, would drown what they fix) or the error of what the
  head writes, ``|W_O (z' - z)|^2`` with ``z`` the pattern times the head's values (weights that bring the
  write closer are what the substitution test puts back, though the pattern may gain less than a tenth;
  measured on SmolLM2 in benchmarks/README.md). The description put back is then scored on the held-out
  windows: the same Pearson correlation over every causal cell and bootstrap over windows as a mixture's,
  which becomes the description's agreement (the mixture's own stays in the evidence as ``mix_r``). Key
  weights that would bring that agreement under :data:`headlens.atlas.describe.AGREEMENT`, where the
  description without them reaches it, are left out, and then the query factors alike: a page would name a
  role at an agreement that argues against it.
* **An extra pass.** The patterns are read again (the fit windows and the held-out ones, one forward
  each); the role is the mixture's (a key weighting names none).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from headlens.atlas.mixture import MIN_DROP, corr
from headlens.atlas.querysink import clause as query_clause
from headlens.atlas.sinkbands import key_weighted, query_rested

PRIOR = 1.0  # attention mass (about one row's) that shrinks each key token's weight towards 1
TOP = 256  # key tokens whose weight a description keeps, by the head's attention on them on the fit windows
ITERS = 4  # proportional-fitting steps (the weights converge in a few)
SHOWN = 4  # the tokens a sentence names each way (most and least preferred)


def key_preferences(model: Any, descriptions: list[Any], fit: list[torch.Tensor], held: list[torch.Tensor],
                    batch_size: int, classes: dict[str, torch.Tensor], strings: list[str],
                    progress: Callable[[int, int], None] | None = None, query: bool = True) -> list[Any]:
    """``descriptions`` with ``query_sink`` (query token id -> odds factor on the first token's share,
    :mod:`headlens.atlas.querysink`) and ``key_pref`` (token id -> weight) set where each helps (module docstring),
    their agreement and CI those of the pattern put back, and a sentence saying it; the others as they are.
    ``query``: False fits no query factors (the key weights alone, as before them)."""
    from headlens.atlas.describe import AGREEMENT, _with_ci
    from headlens.atlas.querysink import fit_odds
    from headlens.atlas.substitute import simulated_patterns

    heads = [d for d in descriptions if d.mixture]
    if not heads or len(fit) < 2:
        return descriptions
    V = int(model.cfg.d_vocab)
    n_total = len(fit) + len(held)
    tick = (lambda off: (lambda d: progress(off + d, n_total))) if progress else (lambda off: (lambda d: None))
    seen = torch.zeros(len(heads), V, dtype=torch.float64)  # per head: A_v, its attention on keys holding v
    stored, rows = [], []
    for tok, preds, ok, kept in _passes(model, heads, fit[0::2], batch_size, classes, tick(0)):
        idx = tok[:, None, 1:].expand_as(ok[..., 1:]).reshape(-1)
        patterns = simulated_patterns(heads, preds, ok.bool().any(-1))
        at = ok.bool().any(-1)  # (B, Q): the countable rows
        rows.append((tok[at], torch.stack([patterns[(d.layer, d.head)][..., 0][at] for d in heads]).double(),
                     torch.stack([(kept[d.layer][:, d.head] * ok)[..., 0][at] for d in heads]).double()))
        for j, d in enumerate(heads):
            seen[j].index_add_(0, idx, (kept[d.layer][:, d.head] * ok)[..., 1:].reshape(-1).double())
        stored.append((tok, preds, ok))
    if query:
        odds, q_top, q_moved = fit_odds(torch.cat([r[1] for r in rows], 1), torch.cat([r[2] for r in rows], 1),
                                        torch.cat([r[0] for r in rows]), V)  # (N, V), (n,), (N, n)
    else:
        odds, q_top, q_moved = torch.ones(len(heads), V), torch.zeros(0, dtype=torch.long), torch.zeros(len(heads), 0)
    top = seen.topk(min(TOP, V), -1).indices  # (N, TOP): the tokens a description may weigh
    weight = torch.ones(len(heads), V)  # (N, V)
    for _ in range(ITERS):  # proportional fitting: the rules' predictions read the tokens alone, no forward
        put = torch.zeros(len(heads), V, dtype=torch.float64)  # P_v: the description's, keys weighted
        for tok, preds, ok in stored:
            patterns = simulated_patterns(heads, preds, ok.bool().any(-1))
            idx = tok[:, None, 1:].expand_as(ok[..., 1:]).reshape(-1)
            for j, d in enumerate(heads):
                y = key_weighted(query_rested(patterns[(d.layer, d.head)] * ok, tok, odds[j]), tok, weight[j])
                put[j].index_add_(0, idx, y[..., 1:].reshape(-1).double())
        step = ((seen + PRIOR) / (put + PRIOR)).float().gather(1, top)
        weight.scatter_(1, top, weight.gather(1, top) * step)
    gram = _grams(model, heads)  # (N, d_head, d_head): W_O W_O^T per head, what its z is read by
    err = torch.zeros(len(heads), 3, 4, dtype=torch.float64)  # attention (rows, off the first token), write; p,
    # query factors, keys, both
    values: dict[int, torch.Tensor] = {}
    for tok, preds, ok, kept in _passes(model, heads, fit[1::2], batch_size, classes, tick(len(fit[0::2])), values):
        patterns = simulated_patterns(heads, preds, ok.bool().any(-1))
        for j, d in enumerate(heads):
            x, p = kept[d.layer][:, d.head] * ok, patterns[(d.layer, d.head)] * ok
            v = values[d.layer][:, :, d.head // (kept[d.layer].shape[1] // values[d.layer].shape[2])]  # (B, T, d_head)
            err[j] += _errors(x, p, tok, odds[j], weight[j], v, gram[j])
    by_query = err[:, 0, 1] < (1 - MIN_DROP) * err[:, 0, 0]  # (N,): whole rows' attention
    base = torch.where(by_query[:, None], err[..., 1], err[..., 0])  # (N, 3): no key weights
    keyed = torch.where(by_query[:, None], err[..., 3], err[..., 2])  # (N, 3): with them
    keep = ((keyed[:, 1:] < (1 - MIN_DROP) * base[:, 1:]).any(-1))  # (N,): the attention off the first token or
    # the write, cut by a tenth
    look = torch.full((V,), len(q_top), dtype=torch.long)
    look[q_top] = torch.arange(len(q_top))
    q_held = torch.zeros(len(heads), len(q_top) + 1, dtype=torch.float64)  # the head's first-token mass after each
    q_rows = torch.zeros(len(q_top) + 1, dtype=torch.float64)  # top query token, held out; and its rows
    per_window: list[torch.Tensor] = []  # (B, N, 2, 6) per batch: as kept; without the key weights
    for tok, preds, ok, kept in _passes(model, heads, held, batch_size, classes, tick(len(fit))):
        patterns = simulated_patterns(heads, preds, ok.bool().any(-1))
        at = ok.bool().any(-1)  # (B, Q)
        q_idx = look[tok[at]]
        q_rows.index_add_(0, q_idx, torch.ones(len(q_idx), dtype=torch.float64))
        sums = torch.zeros(tok.shape[0], len(heads), 2, 6, dtype=torch.float64)
        for j, d in enumerate(heads):
            x, y = (kept[d.layer][:, d.head] * ok).double(), (patterns[(d.layer, d.head)] * ok).double()
            q_held[j].index_add_(0, q_idx, x[..., 0][at])
            y = query_rested(y, tok, odds[j]) if bool(by_query[j]) else y
            for i, w in enumerate((key_weighted(y, tok, weight[j]) * ok, y) if bool(keep[j]) else (y, y)):
                sums[:, j, i] = torch.stack([ok.sum((1, 2)), x.sum((1, 2)), w.sum((1, 2)), (x * x).sum((1, 2)),
                                             (w * w).sum((1, 2)), (x * w).sum((1, 2))], -1)
        per_window.append(sums)
    r, lo, hi = _with_ci(torch.cat(per_window), corr)  # each (N, 2)
    drop = keep & (r[:, 0] < AGREEMENT) & (r[:, 1] >= AGREEMENT)  # (N,): weights that would name a role under the
    keep &= ~drop  # agreement a role needs, where the description without them has it: left out
    r, lo, hi = (torch.where(keep, v[:, 0], v[:, 1]) for v in (r, lo, hi))  # each (N,)
    back = (r < AGREEMENT) & (torch.tensor([d.agreement for d in heads], dtype=torch.float64) >= AGREEMENT)
    keep &= ~back  # (N,): still under it where the description as it came reaches it: the query factors too,
    by_query &= ~back  # and the description stays as it came
    new = {}
    for j, d in enumerate(heads):
        if not (bool(keep[j]) or bool(by_query[j])):
            continue
        said, change = [], {}
        if bool(by_query[j]):
            change["query_sink"] = {int(t): round(float(odds[j, t]), 4) for t in q_top}
            held_at = {int(t): (float(q_held[j, i] / q_rows[i].clamp(min=1)), int(q_rows[i]))
                       for i, t in enumerate(q_top)}
            said.append(query_clause(change["query_sink"], strings, {int(t): float(q_moved[j, i]) for i, t in
                                                                     enumerate(q_top)}, held_at,
                                     float(q_held[j].sum() / q_rows.sum().clamp(min=1))))
        if bool(keep[j]):
            change["key_pref"] = {int(t): round(float(weight[j, t]), 4) for t in top[j]}
            said.append(_clause(change["key_pref"], strings, {int(t): float(seen[j, t]) for t in top[j]}))
        new[(d.layer, d.head)] = replace(
            d, **change, agreement=float(r[j]), ci=(float(lo[j]), float(hi[j])),
            evidence={**d.evidence, "mix_r": d.agreement, "mix_lo": d.ci[0], "mix_hi": d.ci[1]},
            text=_insert(d.text, _sentence(said, float(r[j]), float(lo[j]), float(hi[j]))))
    return [new.get((d.layer, d.head), d) for d in descriptions]


def _errors(x: torch.Tensor, p: torch.Tensor, tokens: torch.Tensor, odds: torch.Tensor, weight: torch.Tensor,
            v: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """``(3, 4)``: the squared error of the attention (every cell of ``x`` ``(B, Q, K)``, the head's pattern; the
    cells off the first token) and of the write (``|W_O (z' - z)|^2`` over the rows, ``z = x @ v``; ``v``
    ``(B, K, d_head)``, ``gram`` ``W_O W_O^T`` ``(d_head, d_head)``) of four patterns put back: ``p``, ``p`` with the
    query factors ``odds``, with its keys weighted by ``weight``, and with both."""
    x = x.double()
    pu = query_rested(p, tokens, odds)
    z = x @ v.double()  # (B, Q, d_head)
    out = []
    for y in (p, pu, key_weighted(p, tokens, weight), key_weighted(pu, tokens, weight)):  # zero rows stay zero
        y = y.double()
        dz = y @ v.double() - z  # (B, Q, d_head)
        sq = (x - y) ** 2
        out.append(torch.stack([sq.sum(), sq[..., 1:].sum(), ((dz @ gram) * dz).sum()]))
    return torch.stack(out, -1)


def _grams(model: Any, heads: list[Any]) -> torch.Tensor:
    """``(N, d_head, d_head)``: each head's ``W_O W_O^T`` (:meth:`headlens.readout.write.WritePath.w_o`; the linear
    write, also where a post-attention norm rescales it)."""
    from headlens.readout.write import write_path

    path = write_path(model)
    w_o = {la: path.w_o(la).detach().cpu().double() for la in sorted({d.layer for d in heads})}  # (H, d_head, D)
    return torch.stack([w_o[d.layer][d.head] @ w_o[d.layer][d.head].T for d in heads])


def _insert(text: str, sentence: str) -> str:
    """``sentence`` before the paragraph's closing "Role: ..." (the substitution test's gate rewrites that), or last.

    >>> _insert("Attends to x. Role: x.", "It weighs keys."), _insert("No clear role.", "It weighs keys.")
    ('Attends to x. It weighs keys. Role: x.', 'No clear role. It weighs keys.')
    """
    head, sep, role = text.rpartition(" Role: ")
    return f"{head} {sentence}{sep}{role}" if sep else f"{text} {sentence}"


def _sentence(said: list[str], r: float, lo: float, hi: float) -> str:
    """The clauses ``said`` (:func:`_clause`, :func:`headlens.atlas.querysink.clause`) and the agreement of the
    description put back with what they say.

    >>> _sentence(["It weighs keys", "It rests more after ','"], 0.9, 0.8, 1.0)
    "It weighs keys. It rests more after ',': put back so, its predicted attention agrees with the real one at r = 0.90 [0.80, 1.00] on held-out text."
    """
    return (f"{'. '.join(said)}: put back so, its predicted attention agrees with the real one at r = {r:.2f} "
            f"[{lo:.2f}, {hi:.2f}] on held-out text.")


def _clause(pref: dict[int, float], strings: list[str], mass: dict[int, float] | None = None) -> str:
    """What the key weights say. The tokens named are those whose weight moves the most attention (``mass``: token
    -> the head's attention on it off the first token, ``A_v``; a weight ``w`` moves about ``A_v |1 - 1/w|``), not
    the largest ratios: a token seen twice can weigh 30x and move nothing.

    >>> s = _clause({1: 30.0, 2: 2.0, 3: 0.5}, ["x", "a", "b", "c"], {1: 0.01, 2: 5.0, 3: 1.0})
    >>> s[s.index("(most"):s.index(" tokens weighted")]
    "(most 'b' 2.0x, 'a' 30.0x; least 'c' 0.50x; 3"
    """
    mass = mass or {}
    moved = lambda t: mass.get(t, 1.0) * abs(1 - 1 / max(pref[t], 1e-9))  # noqa: E731
    name = lambda t: repr(strings[t]) if t < len(strings) else str(t)  # noqa: E731
    most = ", ".join(f"{name(t)} {pref[t]:.1f}x" for t in sorted((t for t in pref if pref[t] > 1), key=moved,
                                                                   reverse=True)[:SHOWN])
    least = ", ".join(f"{name(t)} {pref[t]:.2f}x" for t in sorted((t for t in pref if pref[t] < 1), key=moved,
                                                                    reverse=True)[:SHOWN])
    said = "; ".join(s for s in (f"most {most}" if most else "", f"least {least}" if least else "") if s)
    return (f"Among the keys its rules spread a row over, it weighs some by their token ({said}; {len(pref)} "
            f"tokens weighted, fit on the pass's windows)")


def _passes(model: Any, heads: list[Any], windows: list[torch.Tensor], batch_size: int,
            classes: dict[str, torch.Tensor], tick: Callable[[int], None],
            values: dict[int, torch.Tensor] | None = None) -> Any:
    """Per batch of ``windows``: the tokens ``(B, K)``, the rules' whole-row predictions the ``heads`` name
    (:func:`headlens.atlas.substitute.rule_predictions`), ``ok`` ``(B, Q, K)`` float32 (1 on the countable causal
    cells) and layer -> the real patterns ``(B, H, Q, K)`` float32 of the layers of ``heads``; ``values``, when
    given, is filled with layer -> that batch's values ``(B, T, H_kv, d_head)`` float32."""
    from headlens.atlas.heldout import _batch
    from headlens.atlas.rules import candidate_rules, causal_cells, used_targets
    from headlens.atlas.substitute import rule_predictions
    from headlens.models.vocab import vocab

    rules, special = candidate_rules(), vocab(model).special
    layers = sorted({d.layer for d in heads})
    used = sorted({r for d in heads for r in d.mixture})
    for start in range(0, len(windows), batch_size):
        batch = _batch(windows[start:start + batch_size], special, classes)
        cells = causal_cells(batch)  # (B, Q, K)
        kept: dict[int, torch.Tensor] = {}

        def keep(layer: int, into: dict[int, torch.Tensor] = kept) -> Any:
            def hook(pattern: torch.Tensor, hook: Any) -> None:  # (B, H, Q, K)
                into[layer] = pattern.detach().cpu().float()
            return hook

        def keep_v(layer: int) -> Any:
            def hook(v: torch.Tensor, hook: Any) -> None:  # (B, T, H_kv, d_head)
                values[layer] = v.detach().cpu().float()  # type: ignore[index]
            return hook

        hooks = [(f"blocks.{la}.attn.hook_pattern", keep(la)) for la in layers]
        hooks += [(f"blocks.{la}.attn.hook_v", keep_v(la)) for la in layers] if values is not None else []
        with torch.no_grad(), model.hooks(hooks):
            logits = model(batch.tokens.to(model.device))  # (B, T, V)
        hits = used_targets(rules, used, batch, cells, logits.cpu())
        del logits
        yield batch.tokens, rule_predictions(batch, hits), cells.float(), kept
        tick(min(start + batch_size, len(windows)))
