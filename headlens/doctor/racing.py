"""Sequential evaluation of head layouts: stop running a layout once it is clearly worse, not after every row.

Why it looks like this:

* **Most layouts lose at once.** On a trained model every wrong split mixes slices of several trained
  heads (and rotates the wrong pairs under RoPE): its loss is nats per token worse on the first rows
  already. Running it on every row of every source is what made the doctor take over 20 minutes on a
  135M-parameter LM. So each source is run in looks of 8, 16, 32 ... rows (:func:`looks`); after each,
  a layout whose loss is above the best running layout's by more than the margin *and* by
  ``STOP_FACTOR * z_min`` standard errors of the paired per-row gap (the bar is twice the verdict's
  because the gap is looked at several times) is dropped (:func:`race`). When one layout is left the
  source is done. A dropped layout keeps the losses of the rows it ran, and the verdict
  (:func:`headlens.doctor.verdict.decide`) compares it with the best on exactly those rows.
* **Nothing is dropped on less than 8 rows**: a standard error from fewer rows is too unsure to act on
  (the verdict's own z is then read on all the rows a source has).
* **Across sources** (:func:`race_sources`): a layout dropped on a source that fits the model (a text it
  predicts, or random segments it copies) is not run on the sources after it; the claimed layout always
  is, so every source reports it. A source left with one layout compares nothing and decides nothing.
  Once a source that fits has decided (passed or failed), the sources after it are not run at all
  (``all_sources`` runs them): on SmolLM2 the prose decides, and the three random-token sources would add
  a third to the time to say the same.
* **Undecided layouts run to the end.** Untrained weights, whose splits differ by noise, run every row of
  every source, exactly as without this rule: the sequential rule saves time only where the evidence is
  already overwhelming, so it cannot turn an inconclusive check into a verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch

from headlens.doctor.sources import EvalSource

MIN_LOOK = 8  # rows before a layout may be dropped
STOP_FACTOR = 2.0  # drop at z >= STOP_FACTOR * z_min: the wider bar pays for looking more than once

# (layout key, rows [(N_i, T_i)]) -> per-row mean losses (N,), or None when the layout cannot run
Evaluate = Callable[[Hashable, list[torch.Tensor]], torch.Tensor | None]


def looks(n_rows: int) -> list[int]:
    """Row counts after which the race is looked at: 8, 16, 32 ... and the last row.

    >>> looks(48), looks(16), looks(5)
    ([8, 16, 32, 48], [8, 16], [5])
    """
    out, k = [], MIN_LOOK
    while k < n_rows:
        out.append(k)
        k *= 2
    return [*out, n_rows]


def count_rows(rows: list[torch.Tensor]) -> int:
    return sum(int(r.shape[0]) for r in rows)


def take(rows: list[torch.Tensor], start: int, stop: int) -> list[torch.Tensor]:
    """Rows ``start:stop`` of a source, counted across its length groups ``[(N_i, T_i)]``."""
    out, at = [], 0
    for r in rows:
        lo, hi = max(start, at), min(stop, at + r.shape[0])
        if lo < hi:
            out.append(r[lo - at:hi - at])
        at += r.shape[0]
    return out


def row_weights(rows: list[torch.Tensor]) -> torch.Tensor:
    """``(N,)`` predicted tokens of each row (its length less one): the weight of its mean loss."""
    if not rows:
        return torch.zeros(0, dtype=torch.float64)
    return torch.cat([torch.full((r.shape[0],), r.shape[1] - 1, dtype=torch.float64) for r in rows])


def paired_z(worse: torch.Tensor, better: torch.Tensor) -> float:
    """Paired z-score of the per-row loss gap (how many standard errors ``worse`` is above ``better``)."""
    gap = worse - better
    if gap.numel() < 2 or float(gap.std()) == 0.0:
        return 0.0 if float(gap.mean()) == 0.0 else float("inf")
    return float(gap.mean() / (gap.std() / gap.numel() ** 0.5))


def gap(worse: torch.Tensor, better: torch.Tensor, weights: torch.Tensor) -> float:
    """Token-weighted mean of the per-row loss gap (nats) over the rows both ran (the first ``len(worse)``)."""
    n = worse.numel()
    return float(((worse - better[:n]) * weights[:n]).sum() / weights[:n].sum())


class Tally:
    """Progress of the race in tokens: run so far, and at most how many the running layouts still have to run on
    the current source (the sources after it run only if it does not decide, so they count once they start).
    Called as ``tally(key, n_tokens)`` after each run; reports ``progress(done, done + left, what)``."""

    def __init__(self, progress: Callable[[int, int, str], None] | None, label: Callable[[Hashable], str]) -> None:
        self.progress, self.label = progress, label
        self.done, self.left, self.source, self.running = 0, 0, "", None

    def plan(self, n_layouts: int, rows: list[torch.Tensor]) -> None:
        """``n_layouts`` layouts still to run ``rows`` of the current source."""
        self.left = n_layouts * sum(r.numel() for r in rows)
        self._report()

    def __call__(self, key: Hashable, n_tokens: int) -> None:
        self.done, self.left, self.running = self.done + n_tokens, max(0, self.left - n_tokens), key
        self._report()

    def _report(self) -> None:
        if self.progress is not None and self.done:
            self.progress(self.done, self.done + self.left, f"doctor ({self.source}): {self.label(self.running)}")


def race(evaluate: Evaluate, keys: list[Hashable], rows: list[torch.Tensor], margin: float, z_stop: float,
         tally: Tally | None = None) -> tuple[dict[Hashable, torch.Tensor], list[Hashable]]:
    """Per-row losses of each layout in ``keys`` on ``rows`` (see the module docstring), and the layouts not
    dropped: they ran every row looked at, dropped ones the rows before they were dropped. Layouts
    ``evaluate`` cannot run (None) are left out of both. ``tally`` is told the work left after each look."""
    per_row: dict[Hashable, torch.Tensor] = {}
    alive, done = list(keys), 0
    weights = row_weights(rows)
    plan = tally.plan if tally is not None else lambda n, rows: None
    plan(len(alive), rows)
    for stop in looks(count_rows(rows)):
        chunk = take(rows, done, stop)
        for k in list(alive):
            loss = evaluate(k, chunk)
            if loss is None:
                alive.remove(k)
                per_row.pop(k, None)
                continue
            per_row[k] = torch.cat([per_row.get(k, torch.zeros(0, dtype=torch.float64)), loss.double()])
        done = stop
        if len(alive) <= 1 or done < MIN_LOOK:  # fewer than MIN_LOOK rows: this was the only look
            break
        w = weights[:done]
        best = min(alive, key=lambda k: float((per_row[k] * w).sum()))
        alive = [k for k in alive if k == best or not (gap(per_row[k], per_row[best], w) > margin
                                                       and paired_z(per_row[k], per_row[best]) >= z_stop)]
        if len(alive) == 1:
            break
        plan(len(alive), take(rows, done, count_rows(rows)))
    plan(0, [])  # this source is done
    return per_row, alive


def race_sources(evaluate: Callable[[Hashable, list[torch.Tensor]], torch.Tensor | None], keys: list[Hashable],
                 sources: list[EvalSource], claimed: Hashable, margin: float, z_min: float,
                 weigh: Callable[[EvalSource, dict[Hashable, torch.Tensor], str], Any], all_sources: bool = False,
                 tally: Tally | None = None) -> tuple[list[Any], list[str]]:
    """Race the layouts on each source in turn (claimed first); ``weigh(source, per_row, note)`` turns a
    source's losses into its verdict (:class:`headlens.doctor.verdict.Source`), whose ``fit.fits`` says
    whether the layouts it dropped stay dropped and whose ``usable`` whether the sources after it run.
    Returns the weighed sources and the names of those not run."""
    order = [claimed, *(k for k in keys if k != claimed)]
    alive, ruled_out_on, out = list(order), [], []
    for i, src in enumerate(sources):
        run = [k for k in order if k in alive or k == claimed]
        skipped = len(order) - len(run)
        note = (f"not run: {skipped} layout{'s' * (skipped != 1)} clearly worse on the {' and '.join(ruled_out_on)}"
                if skipped else "")
        if tally is not None:
            tally.source = src.name
        per_row, left = race(evaluate, run, src.rows, margin, STOP_FACTOR * z_min, tally)
        weighed = weigh(src, per_row, note)
        out.append(weighed)
        if weighed.usable and not all_sources:
            return out, [s.name for s in sources[i + 1:]]
        if weighed.fit.fits and len(per_row) > 1:
            kept = [k for k in alive if k in left]
            if len(kept) < len(alive):
                alive, ruled_out_on = kept, [*ruled_out_on, src.name]
    return out, []
