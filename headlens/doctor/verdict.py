"""The doctor's verdict on head counts: from per-row losses of every candidate layout to which one the
weights were trained with, how sure that is, and the warnings every family words alike.

Why several evaluation sources and a three-way verdict: a loss comparison is only evidence when the
text fits the model. Python source through a word-level tokenizer is the unknown token almost
everywhere, every layout predicts it equally (badly), and "the claim is not contradicted" is then no
finding at all. So each source is weighed on its own (:func:`weigh_source`): a text is checked first
(share of unknown tokens, distinct tokens, the model's loss against a unigram model of the same text,
:func:`text_fit`); the model-agnostic sources (periodic segments of distinct random ids: any model that
copies predicts every period after the first, and a wrong split breaks the copy) count only when the
model beats the unigram loss on them, i.e. when it copies (a model trained on prose alone does not, and
its layouts' losses on random ids differ by noise however large). The verdict
comes from a source that separates the layouts (:func:`choose`): PASSED when the claimed layout is the
only one that fits, FAILED when it clearly does not, INCONCLUSIVE when no source can tell.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from headlens.doctor.racing import gap, paired_z, row_weights, take


@dataclass(frozen=True)
class Verdict:
    """Which head count the losses point to, and how sure: see :func:`decide`."""

    losses: dict[int, float]  # n_heads -> token-weighted mean loss on the rows it ran
    z: dict[int, float]  # n_heads -> paired z of its loss gap to the best, on the rows it ran
    best: int  # lowest loss of the layouts that ran every row (the sequential rule drops the others)
    plausible: list[int]  # within ``margin`` nats or ``z_min`` standard errors of the best
    inferred: int  # the claim when it is plausible, else the best
    gaps: dict[int, float] = field(default_factory=dict)  # n_heads -> paired loss gap to the best (nats)
    rows: dict[int, int] = field(default_factory=dict)  # n_heads -> rows it ran


def head_count_warnings(v: Any, config_heads: int, n_heads: int | None, said: str, best: str,
                        trained: str) -> list[str]:
    """The doctor's warnings for verdict ``v`` (from :func:`decide`), every family worded alike.

    ``said`` is what the config claims, ``best`` how the weights work best ("split into 2 heads"),
    ``trained`` what they were trained with ("with 2"); ``n_heads`` the count the user asked about.
    """
    out = []
    if v.inferred != config_heads:
        out.append(f"the config says {said} but the weights work best {best} (loss "
                   f"{v.losses[v.inferred]:.3f} vs {v.losses[config_heads]:.3f} nats): this checkpoint's "
                   f"config is wrong")
    if n_heads is not None and n_heads != v.inferred:
        out.append(f"you asked for n_heads={n_heads} but the weights were trained {trained} "
                   f"(loss {v.losses[v.inferred]:.3f} vs {v.losses[n_heads]:.3f} nats)")
    if len(v.plausible) > 1:
        out.append(f"weak evidence: n_heads={v.plausible} fit about equally well on this text; "
                   f"give more or more typical text (--text) to separate them")
    return out


def decide(per_row: dict[int, torch.Tensor], rows: list[torch.Tensor], claimed: int, margin: float,
           z_min: float) -> Verdict:
    """Turn per-row losses of every candidate head count into a :class:`Verdict`.

    A layout the sequential rule dropped (:mod:`headlens.doctor.racing`) ran only the first rows; it is
    compared with the best on exactly those rows.
    """
    w = row_weights(rows)
    n = {h: r.numel() for h, r in per_row.items()}
    losses = {h: float((r * w[: n[h]]).sum() / w[: n[h]].sum()) for h, r in per_row.items()}
    best = min((h for h in per_row if n[h] == max(n.values())), key=losses.get)
    gaps = {h: gap(per_row[h], per_row[best], w) for h in per_row}
    z = {h: paired_z(per_row[h], per_row[best][: n[h]]) for h in per_row}
    # head counts the evaluation cannot tell apart from the best: within the margin or z_min standard errors
    plausible = [h for h in per_row if gaps[h] <= margin or z[h] <= z_min]
    return Verdict(losses, z, best, plausible, claimed if claimed in plausible else best, gaps, n)


MIN_SHARE_KNOWN = 0.8  # a text with more than 20 % unknown tokens does not fit the model's vocabulary
MIN_DISTINCT = 16  # distinct tokens a text needs (fewer when the vocabulary is small: a quarter of it)


@dataclass(frozen=True)
class TextFit:
    """Whether an evaluation text fits the model, and why not (``problems``, empty when it fits)."""

    unknown_share: float  # share of predicted tokens that are the tokenizer's unknown token
    distinct_tokens: int  # distinct predicted tokens
    model_loss: float  # the model's loss on the text (its best layout), nats
    unigram_loss: float  # the loss to beat, nats: the text's own token frequencies (a unigram model fit to it),
    # or for generated ids the loss of guessing uniformly among the ids drawn from (``baseline`` "chance")
    problems: list[str] = field(default_factory=list)
    baseline: str = "unigram"  # "unigram" | "chance"

    @property
    def fits(self) -> bool:
        return not self.problems


def text_fit(rows: list[torch.Tensor], model_loss: float, n_vocab: int, unknown_id: int | None = None,
             chance: float | None = None) -> TextFit:
    """Check an evaluation text (rows ``[(N_i, T_i)]``, first column BOS) against the model that reads it.

    ``chance``: for ids drawn uniformly from a pool, the log of its size. A model that does not read the
    repeats cannot beat it on average (Gibbs' inequality), so beating it means the model copies; the
    unigram model fit to a few rows is no fair bar there (it knows which ids the rows hold: log 64 for 8
    rows of 8 repeated ids drawn from 49,149).

    >>> fit = text_fit([torch.tensor([[1, 0, 0, 0, 0]])], model_loss=4.17, n_vocab=66, unknown_id=0)
    >>> fit.fits, fit.problems[0]
    (False, '100% of its tokens are the unknown token')
    """
    targets = torch.cat([r[:, 1:].flatten() for r in rows])  # predicted tokens (the BOS column is never one)
    counts = torch.bincount(targets).double()
    p = counts[counts > 0] / counts.sum()
    unigram = max(0.0, float(-(p * p.log()).sum()))
    unknown = float((targets == unknown_id).double().mean()) if unknown_id is not None else 0.0
    distinct = int((counts > 0).sum())
    problems = []
    if unknown > 1 - MIN_SHARE_KNOWN:
        problems.append(f"{unknown:.0%} of its tokens are the unknown token")
    need = min(MIN_DISTINCT, max(2, n_vocab // 4))
    if distinct < need:
        problems.append(f"only {distinct} distinct tokens (fewer than {need})")
    if chance is not None:
        if not model_loss < chance:
            problems.append(f"the model predicts it no better than chance ({model_loss:.3f} vs {chance:.3f} nats)")
        return TextFit(unknown, distinct, model_loss, chance, problems, "chance")
    if not model_loss < unigram:
        problems.append(f"the model predicts it no better than its token frequencies "
                        f"({model_loss:.3f} vs {unigram:.3f} nats)")
    return TextFit(unknown, distinct, model_loss, unigram, problems)


def status(v: Verdict, claimed: int) -> str:
    """``passed`` when the claim is the only plausible layout, ``failed`` when it is not plausible at all,
    else ``inconclusive`` (the claim fits, but so does another layout, or it ran alone: nothing was tested)."""
    if len(v.losses) < 2:
        return "inconclusive"
    if claimed not in v.plausible:
        return "failed"
    return "passed" if v.plausible == [claimed] else "inconclusive"


@dataclass(frozen=True)
class Source:
    """One evaluation source and what its losses say about the layouts."""

    name: str  # "text" | "random tokens (period P)"
    description: str
    verdict: Verdict
    status: str  # see :func:`status`
    separation: float  # nats from the best layout to the runner-up (how clearly it separates them)
    fit: TextFit  # random tokens fit a model that copies: it predicts them better than their frequencies
    note: str = ""  # what was not run on it (layouts ruled out on an earlier source)
    margin: float = 0.0  # nats a gap must exceed to count (the verdict's margin)

    @property
    def usable(self) -> bool:
        """Whether this source can decide: it fits the model and separates the claim from the rest."""
        return self.fit.fits and self.status != "inconclusive"


def weigh_source(name: str, description: str, per_row: dict[int, torch.Tensor], rows: list[torch.Tensor],
                 claimed: int, margin: float, z_min: float, n_vocab: int, unknown_id: int | None = None,
                 note: str = "", chance: float | None = None) -> Source:
    """:func:`decide` on one source, and its :func:`text_fit` on the rows its best layout ran (random token
    ids fit only a model that copies them: without a copy it predicts them no better than their
    frequencies, and its layouts' losses on them are noise, however far apart)."""
    v = decide(per_row, rows, claimed, margin, z_min)
    gaps = sorted(g for h, g in v.gaps.items() if h != v.best)
    fit = text_fit(take(rows, 0, v.rows[v.best]), v.losses[v.best], n_vocab, unknown_id, chance)
    return Source(name, description, v, status(v, claimed), gaps[0] if gaps else 0.0, fit, note, margin)


def choose(sources: list[Source]) -> tuple[Source, str]:
    """The source the verdict is taken from, and the verdict: the usable source that separates the layouts
    most clearly; with none usable, ``inconclusive`` (shown on the random-token source, the last)."""
    usable = [s for s in sources if s.usable]
    if not usable:
        return sources[-1], "inconclusive"
    best = max(usable, key=lambda s: s.separation if math.isfinite(s.separation) else 0.0)
    return best, best.status


def source_warnings(sources: list[Source], verdict: str) -> list[str]:
    """Say which texts do not fit the model and, when inconclusive, why and what would help (the random
    tokens only then, in one line: a model that does not copy is no fault of the checkpoint)."""
    out = [f"the text ({s.description}) does not fit this model: {'; '.join(s.fit.problems)}; not used for the "
           f"verdict" for s in sources if s.name == "text" and not s.fit.fits]
    misfits = [s for s in sources if s.name != "text" and not s.fit.fits]
    if verdict == "inconclusive" and misfits:
        problems = sorted({p.split(" (")[0] for s in misfits for p in s.fit.problems})
        out.append(f"the {', '.join(s.name for s in misfits)} do not fit this model: {'; '.join(problems)} "
                   f"(it does not copy them); not used for the verdict")
    if verdict == "inconclusive":
        out.append(inconclusive_reason(sources))
    return out


def inconclusive_reason(sources: list[Source]) -> str:
    """Why no source decided, and advice only where it follows from the reason: nothing to compare (one layout
    ran), a source the model predicts that does not separate the layouts, or no source the model predicts
    (then, and only then, text it was trained on would help)."""
    if max(len(s.verdict.losses) for s in sources) < 2:
        return ("inconclusive: only the claimed layout loaded and ran, so there was nothing to compare it with "
                "(every other split of these projection widths failed to load or run)")
    fitting = [s for s in sources if s.fit.fits]
    if fitting:
        s = fitting[0]
        v = s.verdict
        resolvable = any(v.gaps[h] > s.margin for h in v.plausible)  # beyond the margin, within the noise
        what = "its token frequencies" if s.fit.baseline == "unigram" else "chance"
        return (f"inconclusive: the model predicts the {s.name} ({s.fit.model_loss:.3f} vs {s.fit.unigram_loss:.3f} "
                f"nats for {what}), but layouts {sorted(v.plausible)} fit it about equally well: these weights "
                f"barely depend on the split" + ("; more rows (--rows) would resolve the gaps" if resolvable else ""))
    return ("inconclusive: no evaluation source separates the head layouts (untrained weights, or text the model "
            "does not predict); give text the model was trained on (--text)")


def source_reports(sources: list[Source], chosen: Source, d_head: Any, n_kv: Any = None) -> list[Any]:
    """Every source as a :class:`~headlens.doctor.report.SourceEvidence`; ``d_head(h)`` / ``n_kv(h)`` give the
    head width and key/value heads of the layout with ``h`` query heads."""
    from headlens.doctor.report import HeadCountEvidence, SourceEvidence

    out = []
    for s in sources:
        v = s.verdict
        evidence = [HeadCountEvidence(h, d_head(h), v.losses[h], v.gaps[h], v.z[h],
                                      None if n_kv is None else n_kv(h), v.rows[h]) for h in sorted(v.losses)]
        out.append(SourceEvidence(s.name, s.description, s.status, s.separation, s is chosen, evidence,
                                  s.fit.fits, list(s.fit.problems), s.fit.unknown_share, s.fit.distinct_tokens,
                                  s.fit.unigram_loss, s.note, s.fit.baseline))
    return out
