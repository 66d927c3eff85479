"""name_mover and negative_name_mover (Wang et al. 2022; McDougall et al. 2023): at END of an IOI prompt a
name mover attends to the indirect object and writes it into the prediction over the subject; a negative
name mover attends to a name and writes against it.

Each is a pattern detector on the IOI probe (:mod:`headlens.probes.ioi`, which marks the names' positions at
the END row) with a :class:`~headlens.detectors.base.Gate` on what the head writes:

* ``name_mover``: T(END) = {IO}. Score = attention mass from END to IO (uniform baseline ``1 / (END + 1)``).
  Gate: the head's direct logit attribution to ``logit(IO) - logit(S)`` at END
  (:func:`headlens.readout.dla.head_attributions`, the final norm's scale frozen), CI above zero.
* ``negative_name_mover``: T(END) = {IO, S1, S2}, the names. Score = attention mass from END to them
  (baseline ``3 / (END + 1)``). Gate: per prompt, the head's direct logit attribution to the name it
  attends to more (IO, or S over both its positions) minus the other name, CI below zero. Wang et al.'s
  negative name movers attend to IO and write against IO; a head that attends to S and pushes S down
  (copy suppression of the subject) writes *for* IO - S, yet it writes against the name it reads: both
  are negative name movers here.

Why this shape (and not a new kind): the attention half is exactly a pattern detector, so it gets the
scan, the dense and sparse paths, resume and torchrun; the writing half is one statistic per prompt and
head from one extra forward per batch (the same forward reads, for the negative type, the END row of each
pattern), scored with the same bootstrap and added to the label rule by :mod:`headlens.scoring.gates`. A
detector that is neither a target list nor weights fits as *a target list plus a gate*.

What it cannot see: heads that move a name from elsewhere than END, or through later heads (only the
direct path to the logits counts); a head that attends to IO and writes nothing about names (no label:
the gate fails); backup name movers that act only when others are ablated (ablate and rescore to see them).
"""

from __future__ import annotations

from typing import Any

import torch

from headlens.detectors.base import Detector, Gate, finish_targets
from headlens.probes.base import ProbeBatch
from headlens.readout.attention import EndRows, attention_rows
from headlens.readout.dla import head_attributions


def _marks(batch: ProbeBatch, names: tuple[str, ...]) -> torch.Tensor:
    """``(B, T, M)``: the named positions the END row reads (``-1`` elsewhere, or without the IOI annotations)."""
    none = torch.full_like(batch.tokens, -1)
    marks = torch.stack([batch.annotations.get(n, none) for n in names], -1)  # (B, T, M)
    r0, r1 = batch.row_range
    return finish_targets(marks[:, r0:r1], batch)


def io_at_end(batch: ProbeBatch) -> torch.Tensor:
    """``(B, T, 1)``: the IO position at each prompt's END row."""
    return _marks(batch, ("IO",))


def names_at_end(batch: ProbeBatch) -> torch.Tensor:
    """``(B, T, 3)``: the positions of IO, S1 and S2 at each prompt's END row."""
    return _marks(batch, ("IO", "S1", "S2"))


def _end_reads(model: Any, probe: Any, cache: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What both gates read at END, from one forward per batch, measured once per probe: each head's direct logit
    attribution to IO - S ``(P, L, H)`` and, where the model shows its patterns, each head's attention row
    ``(P, L, H, T)`` (None where it does not)."""
    key = ("end reads", id(probe))
    if key not in cache:
        last = f"blocks.{model.n_layers - 1}.attn.hook_pattern"
        reader = EndRows(model.n_layers) if last in getattr(model, "hook_dict", {}) else None
        dla = head_attributions(model, probe, also=None if reader is None else reader.hooks)
        cache[key] = dla, None if reader is None else reader.rows(max(len(t) for t in probe.prompts))
    return cache[key]


def dla_io_minus_s(model: Any, probe: Any, cache: dict) -> torch.Tensor:
    """``(P, L, H)``: each head's direct logit attribution to IO - S at END (measured once per probe)."""
    return _end_reads(model, probe, cache)[0]


def dla_against_attended(model: Any, probe: Any, cache: dict) -> torch.Tensor:
    """``(P, L, H)``: the direct logit attribution to the name each head attends to more at END (IO, or S over
    S1 and S2) minus the other name: negative when the head writes against the name it reads."""
    dla, rows = _end_reads(model, probe, cache)
    if rows is None:
        rows = attention_rows(model, list(probe.prompts), probe.positions["END"])  # (P, L, H, T)
    p = torch.arange(len(probe))
    io = rows[p, :, :, probe.positions["IO"]]  # (P, L, H)
    s = rows[p, :, :, probe.positions["S1"]] + rows[p, :, :, probe.positions["S2"]]  # (P, L, H)
    sign = torch.where(io >= s, 1.0, -1.0).double()
    return sign * dla


DETECTOR = Detector("name_mover", "index", io_at_end, "ioi",
                    "at END attends to the indirect object and writes it over the subject (IOI)",
                    gate=Gate("dla", dla_io_minus_s, +1, "direct logit attribution to logit(IO) - logit(S) at END"))
NEGATIVE_DETECTOR = Detector("negative_name_mover", "mask", names_at_end, "ioi",
                             "at END attends to a name (IO or S) and writes against it (IOI)",
                             gate=Gate("dla", dla_against_attended, -1, "direct logit attribution at END to the "
                                       "name the head attends to more, minus the other name"))
