"""A head's description from measured evidence, its rule scored on held-out text (docs/scores.md).

Why it looks like this:

* **A description is a prediction.** Each candidate rule (a causal pattern detector with a predicate:
  previous token, induction, duplicate token; or a fixed offset of 2 or 3) is simulated on held-out windows:
  its predicted off-rest attention spreads each query row's mass evenly over the rule's targets (nothing
  where it has none). The agreement is the Pearson correlation of predicted and real off-rest attention
  over every (query, key) cell of those windows, keys neither the first token nor the query itself, with a
  bootstrap CI over windows (sums per window, resampled).
* **A rule at or above** :data:`AGREEMENT` names the role, even of a head that rests most of the time (an
  induction head on text with few repeats). Below it, a head whose off-rest attention averages under
  :data:`REST` per row "rests on the first token", any other gets "no clear role"; both with the best
  candidate and its score. No language model writes
  or judges the text: each sentence is a template filled with a number measured here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from headlens.detectors.base import Detector, predicate_mask
from headlens.probes.base import ProbeBatch

AGREEMENT = 0.5  # a rule must correlate this well with the head's real off-rest attention to name its role
REST = 0.25  # mean off-rest attention per query row below which a head is said to rest
RULES = ("previous_token", "induction", "duplicate_token")  # registered causal rules a description may name
OFFSETS = (2, 3)  # fixed offsets tried as rules (offset 1 is previous_token)
N_PREDICTED = 5  # "a token the model predicts": among the model's own top N_PREDICTED next tokens at the query
SMALL_VOCAB = 5000  # below this, top 1 only: a top 5 of a few dozen tokens covers much of any window
COPY_SHARE = 0.5  # "writes the token it attends to" when its OV promotes it for this share of exemplar keys


@dataclass(frozen=True)
class Description:
    """A head's tested description: ``role`` (a rule's name, ``"resting"`` or ``"no clear role"``), the best
    ``rule`` and its held-out ``agreement`` with CI, every candidate's agreement, and the paragraph ``text``."""

    layer: int
    head: int
    role: str
    rule: str
    agreement: float
    ci: tuple[float, float]
    text: str
    candidates: dict[str, float] = field(default_factory=dict)
    evidence: dict[str, float] = field(default_factory=dict)


def candidate_rules() -> dict[str, Detector]:
    """name -> detector: the rules a description may name."""
    from headlens.detectors import get_detector

    rules = {name: get_detector(name) for name in RULES}
    for d in OFFSETS:
        rules[f"offset_{d}"] = Detector(f"offset_{d}", "mask", None, None, f"attends {d} tokens back",
                                        predicate=lambda batch, q, k, d=d: k == q - d)
    rules["predicted_token"] = Detector("predicted_token", "mask", None, None, "attends to an earlier copy of a "
                                        f"token the model predicts next (its top {N_PREDICTED})",
                                        predicate=_predicted)
    return rules


def _predicted(batch: ProbeBatch, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``(B, C, K)``: key k holds one of the model's top next-token predictions at q (annotations ``pred{i}``,
    the model's own logits on the window): the pattern of copy suppression (McDougall et al. 2023)."""
    x = batch.tokens[:, k]  # (B, 1, K)
    hit = torch.zeros(x.shape[0], q.shape[0], k.shape[1], dtype=torch.bool)
    for i in range(N_PREDICTED):
        hit |= x == batch.annotations[f"pred{i}"][:, q]  # (B, C, K)
    return hit & (k <= q - 1)


def heldout_stats(model: Any, windows: list[torch.Tensor], batch_size: int = 8) -> dict[str, torch.Tensor]:
    """Per held-out window and head, the sums the descriptions need (each ``(W, L, H, ...)`` float64):
    ``rest`` (off-rest mass, first-token mass, query rows) and per rule ``corr:<name>`` (n, sx, sy, sxx, syy,
    sxy of real vs predicted off-rest attention) and ``mass:<name>`` (mass on targets, rows with a target,
    chance mass)."""
    from headlens.models.vocab import vocab

    v, L = vocab(model), model.cfg.n_layers
    rules = candidate_rules()
    out: dict[str, list[torch.Tensor]] = {}
    for start in range(0, len(windows), batch_size):
        seqs = windows[start:start + batch_size]
        batch = _batch(seqs, v.special)
        pattern, predicted = _patterns(model, batch.tokens, L)  # (B, L, H, Q, K), (B, T, N_PREDICTED)
        batch.annotations.update({f"pred{i}": predicted[..., i] for i in range(N_PREDICTED)})
        T = pattern.shape[-1]
        q, k = torch.arange(T)[:, None], torch.arange(T)[None, :]
        cells = (k >= 1) & (k < q) & batch.valid[:, None, :] & batch.query_ok[:, :, None]  # (B, Q, K) off-rest
        hits = {name: predicate_mask(rule.predicate, batch, 0, T, 0, T) & cells for name, rule in rules.items()}
        per_layer = [_layer_sums(pattern[:, layer], batch, cells, hits) for layer in range(L)]  # one layer at a time
        for key in per_layer[0]:
            _put(out, key, torch.stack([s[key] for s in per_layer], 1))  # (B, L, H, ...)
    return {key: torch.cat(vals) for key, vals in out.items()}


def _layer_sums(pattern: torch.Tensor, batch: ProbeBatch, cells: torch.Tensor,
                hits: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One layer's sums per window and head (``(B, H, ...)``) from its pattern ``(B, H, Q, K)`` float64, the
    off-rest ``cells`` ``(B, Q, K)`` and each rule's targets ``hits[name]`` ``(B, Q, K)``."""
    x = pattern * cells[:, None]  # (B, H, Q, K): real off-rest attention
    rows = batch.query_ok.double().sum(-1)[:, None].expand(x.shape[:2])  # (B, H)
    first = (pattern[..., 0] * batch.query_ok[:, None]).sum(-1)  # (B, H)
    n = cells.double().sum((-2, -1))[:, None].expand_as(first)  # (B, H)
    sx, sxx = x.sum((-2, -1)), (x * x).sum((-2, -1))  # (B, H)
    q = torch.arange(pattern.shape[-1])
    out = {"rest": torch.stack([sx, first, rows], -1)}
    for name, hit in hits.items():
        n_t = hit.sum(-1)  # (B, Q): targets per row
        y = (hit / n_t[..., None].clamp(min=1)).double()[:, None]  # (B, 1, Q, K): the rule's prediction
        sums = [n, sx, y.sum((-2, -1)).expand_as(first), sxx, (y * y).sum((-2, -1)).expand_as(first),
                (x * y).sum((-2, -1))]
        out[f"corr:{name}"] = torch.stack(sums, -1)
        has = (n_t > 0).double()  # (B, Q)
        chance = (n_t / (q + 1)).double() * has  # (B, Q): a uniform row's mass on the targets
        on = (pattern * hit[:, None]).sum((-2, -1))  # (B, H): real mass on the targets
        out[f"mass:{name}"] = torch.stack([on, has.sum(-1)[:, None].expand_as(first),
                                           chance.sum(-1)[:, None].expand_as(first)], -1)
    return out


def _put(out: dict[str, list[torch.Tensor]], key: str, value: torch.Tensor) -> None:
    out.setdefault(key, []).append(value.double())


def _batch(seqs: list[torch.Tensor], special: frozenset[int]) -> ProbeBatch:
    lengths = torch.tensor([len(s) for s in seqs])
    T = int(lengths.max())
    tokens = torch.zeros(len(seqs), T, dtype=torch.long)
    for b, s in enumerate(seqs):
        tokens[b, : len(s)] = s
    valid = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    spec = torch.isin(tokens, torch.tensor(sorted(special), dtype=torch.long)) | ~valid
    return ProbeBatch(tokens, lengths, valid, spec, True)


def _patterns(model: Any, tokens: torch.Tensor, n_layers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every head's pattern ``(B, L, H, Q, K)`` float64 on ``tokens`` ``(B, T)``, and the model's own top
    :data:`N_PREDICTED` next tokens at each position ``(B, T, N_PREDICTED)``."""
    got: dict[int, torch.Tensor] = {}

    def keep(layer: int) -> Any:
        def hook(x: torch.Tensor, hook: Any) -> None:
            got[layer] = x.detach().double().cpu()  # (B, H, Q, K)
        return hook

    with torch.no_grad(), model.hooks([(f"blocks.{layer}.attn.hook_pattern", keep(layer)) for layer in range(n_layers)]):
        logits = model(tokens.to(model.device))  # (B, T, V): windows are right-padded; pads are never a query
    top = logits.topk(N_PREDICTED if logits.shape[-1] >= SMALL_VOCAB else 1, -1).indices.cpu()  # (B, T, n)
    predicted = torch.cat([top, top[..., :1].expand(*top.shape[:2], N_PREDICTED - top.shape[-1])], -1)  # (B, T, N)
    return torch.stack([got[layer] for layer in range(n_layers)], 1), predicted


def _corr(s: torch.Tensor) -> torch.Tensor:
    """Pearson correlation from sums ``(..., 6)`` = (n, sx, sy, sxx, syy, sxy)."""
    n, sx, sy, sxx, syy, sxy = s.unbind(-1)
    cov = sxy - sx * sy / n
    var = (sxx - sx * sx / n) * (syy - sy * sy / n)
    return torch.where(var > 0, cov / var.clamp(min=1e-300).sqrt(), torch.zeros_like(cov))


def _with_ci(per_window: torch.Tensor, stat: Any, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pooled statistic over windows and its 95 % bootstrap interval (windows resampled)."""
    from headlens.scoring.stats import bootstrap_weights

    w = bootstrap_weights(per_window.shape[0], 400, seed)  # (n_boot, W)
    boot = stat(torch.einsum("bw,w...->b...", w, per_window))  # (n_boot, L, H)
    return stat(per_window.sum(0)), boot.quantile(0.025, 0), boot.quantile(0.975, 0)


def describe(model: Any, exemplars: Any, heldout: list[torch.Tensor], batch_size: int = 8) -> list[Description]:
    """Every head's :class:`Description`, layer by layer: its rules scored on the ``heldout`` windows, its writes
    read at its exemplars' keys (:func:`headlens.atlas.reads.ov_on_keys`)."""
    from headlens.atlas.reads import ov_on_keys

    stats = heldout_stats(model, heldout, batch_size)
    rules = candidate_rules()
    agree = {name: _with_ci(stats[f"corr:{name}"], _corr) for name in rules}  # each (L, H) x 3
    mass = {name: _with_ci(stats[f"mass:{name}"], lambda s: s[..., 0] / s[..., 1].clamp(min=1)) for name in rules}
    chance = {name: stats[f"mass:{name}"][..., 2].sum(0) / stats[f"mass:{name}"][..., 1].sum(0).clamp(min=1)
              for name in rules}
    off = _with_ci(stats["rest"], lambda s: s[..., 0] / s[..., 2].clamp(min=1))
    first = _with_ci(stats["rest"], lambda s: s[..., 1] / s[..., 2].clamp(min=1))
    out = []
    for layer in range(exemplars.n_layers):
        for h in range(exemplars.n_heads):
            at = (layer, h)
            scores = {name: float(agree[name][0][at]) for name in rules}
            best = max(scores, key=scores.get)
            ov = ov_on_keys(model, layer, h, exemplars.top["attention"][layer * exemplars.n_heads + h])
            ev = {"off_rest": float(off[0][at]), "first": float(first[0][at]), "mass": float(mass[best][0][at]),
                  "mass_lo": float(mass[best][1][at]), "mass_hi": float(mass[best][2][at]),
                  "chance": float(chance[best][at]), "copies": ov["copies"], "suppresses": ov["suppresses"],
                  "n_keys": ov["n"], "off_lo": float(off[1][at]), "off_hi": float(off[2][at]),
                  "first_lo": float(first[1][at]), "first_hi": float(first[2][at])}
            ci = (float(agree[best][1][at]), float(agree[best][2][at]))
            # a rule that fits names the role even of a head that mostly rests (an induction head on text with
            # few repeats); otherwise a head that keeps its attention home rests, and any other has no clear role
            role = best if scores[best] >= AGREEMENT else "resting" if ev["off_rest"] < REST else "no clear role"
            if role == "predicted_token" and ev["suppresses"] >= COPY_SHARE:
                role = "copy_suppression"  # attends to what the model predicts and writes against it
            text = _text(role, rules[best], scores[best], ci, ev)
            out.append(Description(layer, h, role, best, scores[best], ci, text, scores, ev))
    return out


def _text(role: str, rule: Detector, score: float, ci: tuple[float, float], ev: dict[str, float]) -> str:
    """The paragraph: one measured claim per sentence, each with its number (and CI)."""
    tested = (f"Simulated from the rule '{rule.name}' on held-out text, its predicted attention agrees with "
              f"the real one at r = {score:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]")
    if role == "resting":
        return (f"Rests on the first token: {ev['first']:.2f} of its attention per query row "
                f"[{ev['first_lo']:.2f}, {ev['first_hi']:.2f}] goes there on held-out text, and only "
                f"{ev['off_rest']:.2f} [{ev['off_lo']:.2f}, {ev['off_hi']:.2f}] to keys other than the first token "
                f"and itself. Its best candidate rule is '{rule.name}': r = {score:.2f} [{ci[0]:.2f}, {ci[1]:.2f}].")
    writes = _writes_text(ev)
    if role == "no clear role":
        return (f"No clear role: it puts {ev['off_rest']:.2f} of its attention off the first token and itself, "
                f"but its best candidate rule, '{rule.name}' ({rule.description}), explains it poorly. {tested}, "
                f"below the {AGREEMENT:.2f} a role needs.{writes}")
    lift = ev["mass"] / ev["chance"] if ev["chance"] > 0 else float("inf")
    return (f"{rule.description[0].upper()}{rule.description[1:]} ({ev['mass']:.2f} of its attention "
            f"[{ev['mass_lo']:.2f}, {ev['mass_hi']:.2f}] where the rule has a target, {lift:.0f}x chance). "
            f"{tested}.{writes} Role: {role.replace('_', ' ')}.")


def _writes_text(ev: dict[str, float]) -> str:
    n = int(ev["n_keys"])
    if n == 0 or ev["copies"] != ev["copies"]:
        return ""
    if ev["copies"] >= COPY_SHARE:
        return (f" It writes the token it attends to (its OV circuit ranks that token in its top 10 for "
                f"{ev['copies']:.2f} of its {n} exemplar keys).")
    if ev["suppresses"] >= COPY_SHARE:
        return (f" It pushes down the token it attends to (its OV circuit ranks that token in its bottom 10 for "
                f"{ev['suppresses']:.2f} of its {n} exemplar keys), as copy suppression does.")
    return ""
