"""Scoring heads on annotated targets: attention mass from query spans to key spans, and preference.

Definitions (docs/scores.md, with a target's query *span* in place of one query row):

* A target's value for one head is ``m = mean_{q in query} sum_{k in keys} A[q, k]``. Its
  uniform baseline is the same expression under uniform attention,
  ``mean_q |{k in keys visible from q}| / n_visible(q)``. The score is the mean of ``m`` over
  targets, pooled over prompts; the interval bootstraps prompts (:func:`headlens.scoring.stats.summarize`);
  the label is the built-in detectors' rule (the strength's CI low end,
  ``(ci_low - baseline) / (1 - baseline)``, at least κ: :func:`headlens.scoring.stats.strength_label`).
* **Why the mean over the query span's rows**, not one row per query token: a target is one
  fact ("this pronoun refers to that name"), so it counts once however many tokens its words
  became; otherwise a tokenizer that splits the query into three pieces would weigh that fact
  three times. It is Clark et al. 2019's word-level convention: attention *from* a split word
  is averaged over its tokens, attention *to* a split word is summed.
* **Preference accuracy** (Clark et al. 2019): with distractor spans, the head is right on a
  target when the mass on the keys beats the mass on every distractor span (each measured the
  same way, from the same query). A tie at the top earns ``1 / (number tied)``, so uniform
  attention over equal-sized candidates scores exactly the chance level
  ``1 / (1 + n_distractors)``. Its interval bootstraps prompts too.
* **Preference is the primary statistic** where there are distractors: it ranks the heads, it
  decides the label (:func:`headlens.scoring.stats.preference_label`) and the grid's strongest
  label (:func:`headlens.scoring.primary.strength`); the mass stays in the table. Clark et al. judge a coreference head by
  how often it picks the antecedent over the other candidates, and a head can put much mass on
  the antecedent while putting as much on the distractor.

Mechanics: one hook per layer on ``blocks.{l}.attn.hook_pattern``; each ``(query row, key)``
pair of every target is one entry, read from the flattened pattern with one gather and
summed into its target with one ``index_add_`` (no ``(B, H, Q, K)`` tensor outlives its layer).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headlens.detectors import DETECTORS, all_detectors, split_names
from headlens.detectors.base import Detector
from headlens.errors import ProbeError
from headlens.models.vocab import vocab
from headlens.probes import spans as A
from headlens.probes.base import Probe, collate
from headlens.probes.spans import AnnotatedProbe
from headlens.scoring.stats import N_BOOT, Summary, summarize


@dataclass
class TargetStats:
    """Per-target masses of one annotated probe.

    Attributes:
        mass: ``(J, L, H)`` float64, each target's value per head.
        baseline: ``(J,)`` float64, the uniform-attention value.
        prompt: ``(J,)`` long, the prompt each target belongs to.
        distractor_mass: ``(D, L, H)`` float64, one row per (target, distractor span) pair.
        distractor_target: ``(D,)`` long, the target of each pair.
        n_prompts: prompts in the probe.
        rest: ``(J, L, H)`` float64, each target's mass from its query rows (q >= 1) on the first token
            (the ``rest`` column, :mod:`headlens.scoring.resting`); NaN where every query row is at 0.
    """

    mass: torch.Tensor
    baseline: torch.Tensor
    prompt: torch.Tensor
    distractor_mass: torch.Tensor
    distractor_target: torch.Tensor
    n_prompts: int
    rest: torch.Tensor | None = None

    def rest_mass(self) -> torch.Tensor | None:
        """``(L*H,)`` mean resting mass over the targets that have a query row past the first token."""
        if self.rest is None:
            return None
        r = self.rest.reshape(len(self.rest), self.rest[0].numel() if len(self.rest) else 0)  # (J, L*H)
        has = ~r[:, 0].isnan()
        return r[has].mean(0) if bool(has.any()) else None


class _Done(Exception):
    """Raised after the last layer's pattern is reduced."""


def _entries(probe: AnnotatedProbe, rows: range, T: int, causal: bool) -> dict[str, torch.Tensor]:
    """Flat (batch row, q*T + k, slot, weight) entries for the targets, the distractor pairs and the first
    token (``r*``: resting, from the target's query rows q >= 1) of ``rows``."""
    tb, tqk, tj, tw, db, dqk, dj, dw, dt, base, rb, rqk, rj, rw = ([] for _ in range(14))
    j = d = 0
    for b, p in enumerate(rows):
        n_vis = len(probe.prompts[p])
        for t in probe.targets[p]:
            w = 1.0 / len(t.query)
            b_sum = 0.0
            for q in t.query:
                keys = [k for k in t.keys if not causal or k <= q]
                tb += [b] * len(keys); tqk += [q * T + k for k in keys]; tj += [j] * len(keys)  # noqa: E702
                tw += [w] * len(keys)
                b_sum += len(keys) / ((q + 1) if causal else n_vis)
            base.append(b_sum * w)
            resting = [q for q in t.query if q >= 1]
            rb += [b] * len(resting); rqk += [q * T for q in resting]; rj += [j] * len(resting)  # noqa: E702
            rw += [1.0 / len(resting)] * len(resting) if resting else []
            for span in t.distractors:
                for q in t.query:
                    keys = [k for k in span if not causal or k <= q]
                    db += [b] * len(keys); dqk += [q * T + k for k in keys]; dj += [d] * len(keys)  # noqa: E702
                    dw += [w] * len(keys)
                dt.append(j)
                d += 1
            j += 1
    long = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    dbl = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    return {"tb": long(tb), "tqk": long(tqk), "tj": long(tj), "tw": dbl(tw), "J": j,
            "db": long(db), "dqk": long(dqk), "dj": long(dj), "dw": dbl(dw), "D": d,
            "dt": long(dt), "base": dbl(base), "rb": long(rb), "rqk": long(rqk), "rj": long(rj), "rw": dbl(rw)}


def _gather(flat: torch.Tensor, b: torch.Tensor, qk: torch.Tensor, slot: torch.Tensor, w: torch.Tensor,
            n_slots: int) -> torch.Tensor:
    """Sum ``w * flat[b, :, qk]`` into ``n_slots`` rows -> ``(n_slots, H)`` float64."""
    vals = flat[b, :, qk].double() * w[:, None]  # (E, H): one pattern entry per (row, key) pair
    return torch.zeros(n_slots, flat.shape[1], dtype=torch.float64, device=flat.device).index_add_(0, slot, vals)


def measure(model: Any, probe: AnnotatedProbe, batch_size: int = 32,
            progress: Callable[[int], None] | None = None) -> TargetStats:
    """Every head's mass on every target (and distractor) of ``probe``: one forward pass per batch."""
    L, H = model.n_layers, model.n_heads
    v = vocab(model)
    pad_id = getattr(model.tokenizer, "pad_token_id", None)
    pad_id = int(pad_id) if pad_id is not None else v.ordinary[0]
    plain = Probe("annotated", probe.prompts)
    masses, dmasses, bases, prompt_of, dtargets, rests = [], [], [], [], [], []
    n_targets = 0
    state: dict[str, Any] = {}

    def hook_for(layer: int) -> Callable[..., None]:
        def reduce_layer(pattern: torch.Tensor, hook: Any) -> None:
            B, _, Q, K = pattern.shape
            flat = pattern.reshape(B, H, Q * K)  # (B, H, Q*K): row-major over (query_pos, key_pos)
            e = state["entries"]
            state["mass"][:, layer] = _gather(flat, e["tb"], e["tqk"], e["tj"], e["tw"], e["J"]).cpu()
            state["dmass"][:, layer] = _gather(flat, e["db"], e["dqk"], e["dj"], e["dw"], e["D"]).cpu()
            state["rest"][:, layer] = _gather(flat, e["rb"], e["rqk"], e["rj"], e["rw"], e["J"]).cpu()
            if layer == L - 1:
                raise _Done

        return reduce_layer

    fwd_hooks = [(f"blocks.{layer}.attn.hook_pattern", hook_for(layer)) for layer in range(L)]
    with torch.inference_mode():
        for start in range(0, len(probe), batch_size):
            rows = range(start, min(start + batch_size, len(probe)))
            batch = collate(plain, rows, model.is_causal, v.special, pad_id, model.device)
            e = _entries(probe, rows, batch.tokens.shape[1], model.is_causal)
            e = {k: x.to(batch.tokens.device) if isinstance(x, torch.Tensor) else x for k, x in e.items()}
            state.update(entries=e, mass=torch.zeros(e["J"], L, H, dtype=torch.float64),
                         dmass=torch.zeros(e["D"], L, H, dtype=torch.float64),
                         rest=torch.zeros(e["J"], L, H, dtype=torch.float64))
            if e["J"]:
                try:
                    with model.hooks(fwd_hooks):
                        model.forward(batch.tokens, attention_mask=None if model.is_causal else batch.valid.long())
                except _Done:
                    pass
            masses.append(state["mass"])
            dmasses.append(state["dmass"])
            no_row = torch.zeros(e["J"], dtype=torch.bool).index_fill_(0, e["rj"].cpu(), True).logical_not()
            rests.append(state["rest"].masked_fill(no_row[:, None, None], float("nan")))  # only query row 0: none
            bases.append(e["base"].cpu())
            prompt_of += [p for p in rows for _ in probe.targets[p]]
            dtargets.append(e["dt"].cpu() + n_targets)
            n_targets += e["J"]
            state.clear()
            if progress is not None:
                progress(len(rows))
    return TargetStats(torch.cat(masses), torch.cat(bases), torch.tensor(prompt_of, dtype=torch.long),
                       torch.cat(dmasses), torch.cat(dtargets), len(probe), torch.cat(rests))


def preference_credit(st: TargetStats) -> tuple[torch.Tensor, torch.Tensor]:
    """``(J, L*H)`` credit per target (1 right, 0 wrong, ``1/n`` when n candidates tie at the top;
    NaN for targets without distractors) and ``(J,)`` its chance level ``1 / (1 + n_distractors)``."""
    J = len(st.mass)
    t = st.mass.reshape(J, -1)  # (J, N): N = L*H heads
    dm = st.distractor_mass.reshape(len(st.distractor_mass), t.shape[1])  # (D, N); D may be 0: no distractors
    idx = st.distractor_target[:, None].expand_as(dm)
    n_dis = torch.zeros(J, dtype=torch.float64).index_add_(0, st.distractor_target, torch.ones(len(dm), dtype=torch.float64))
    beats = torch.zeros_like(t).scatter_add_(0, idx, (dm > t[st.distractor_target]).double())  # (J, N)
    ties = torch.zeros_like(t).scatter_add_(0, idx, (dm == t[st.distractor_target]).double())  # (J, N)
    credit = torch.where(beats > 0, torch.zeros_like(t), 1.0 / (1.0 + ties))
    has = n_dis > 0
    credit[~has] = float("nan")
    return credit, torch.where(has, 1.0 / (1.0 + n_dis), torch.full_like(n_dis, float("nan")))


def _per_prompt(values: torch.Tensor, prompt: torch.Tensor, n_prompts: int) -> torch.Tensor:
    out = torch.zeros(n_prompts, *values.shape[1:], dtype=torch.float64)
    return out.index_add_(0, prompt, values)


def summaries(st: TargetStats, seed: int = 0, n_boot: int = N_BOOT) -> tuple[Summary, Summary | None]:
    """The score summary (like every detector's) and the preference summary (None without distractors)."""
    J = len(st.mass)
    ones = torch.ones(J, dtype=torch.float64)
    score = summarize(_per_prompt(st.mass.reshape(J, -1), st.prompt, st.n_prompts),
                      _per_prompt(ones, st.prompt, st.n_prompts),
                      _per_prompt(st.baseline, st.prompt, st.n_prompts), seed=seed, n_boot=n_boot)
    credit, chance = preference_credit(st)
    has = ~chance.isnan()
    if not bool(has.any()):
        return score, None
    pref = summarize(_per_prompt(credit[has], st.prompt[has], st.n_prompts),
                     _per_prompt(ones[has], st.prompt[has], st.n_prompts),
                     _per_prompt(chance[has], st.prompt[has], st.n_prompts), seed=seed, n_boot=n_boot)
    return score, pref


# -- which annotated head types classify scores, and their rows ----------------------------------------------------
PREFERENCE_COLUMNS = ("preference", "preference_ci_low", "preference_ci_high")


def prompt_rows(prompts: Any) -> tuple[list[str] | None, dict[str, list[tuple[int, dict[str, Any]]]]]:
    """The prompts' texts (None without prompts) and their annotated rows by head type."""
    if prompts is None:
        return None, {}
    rows = A.read_rows(prompts) if isinstance(prompts, str | os.PathLike) else list(prompts)
    if not rows:
        raise ProbeError("no prompts given")
    texts, groups = A.split_rows(rows)
    clash = [n for n in groups if n in DETECTORS and DETECTORS[n].kind != "annotated"]
    if clash:
        raise ProbeError(f"annotated detector name {clash[0]!r} is a built-in detector defined by code; "
                         f"give your head type another name")
    return texts, groups


def requested_types(detectors: Sequence[str] | str | None, annotated: dict[str, Any]) -> tuple[list[str] | None, list[str]]:
    """The built-in detectors asked for (None: every one) and the user's annotated head types to score."""
    if isinstance(detectors, str):
        detectors = split_names(detectors)
    known = all_detectors()  # entry-point plugins included
    if not detectors:
        return None, [n for n in annotated if n not in known]
    user = [n for n in detectors if isinstance(n, str) and n in annotated and n not in known]
    return [n for n in detectors if not isinstance(n, str) or n not in user], user


def annotated_jobs(model: Any, dets: list[Detector], user_types: list[str], rows: dict[str, Any],
                    have_texts: bool, n_prompts: int, seed: int, truncate: bool) -> dict[str, A.AnnotatedProbe]:
    """The annotated probes to measure: the user's rows per head type, or generated ones (coreference)."""
    jobs = {}
    for name in [d.name for d in dets if d.kind == "annotated"] + user_types:
        if name in rows:
            jobs[name] = A.annotated_probe(model, rows[name], name, truncate=truncate)
        elif not have_texts and name == "coreference":
            from headlens.probes.coreference import rows as coreference_rows

            generated = list(enumerate(coreference_rows(model, n_prompts, seed)))
            jobs[name] = A.annotated_probe(model, generated, name)
            jobs[name].settings["generator"] = "headlens.probes.coreference (gender and number templates)"
    return jobs


def with_preference(rows: list[dict[str, Any]], pref: Summary | None) -> list[dict[str, Any]]:
    nan = float("nan")
    for i, row in enumerate(rows):
        vals = (nan, nan, nan) if pref is None else (float(pref.score[i]), float(pref.ci_low[i]),
                                                     float(pref.ci_high[i]))
        row.update(zip(PREFERENCE_COLUMNS, vals, strict=True))
    return rows

