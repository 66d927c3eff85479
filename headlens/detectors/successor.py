"""successor (weight-based, Gould et al. 2023's succession score): the head maps each item of an ordered list
to the next one ("Monday" -> "Tuesday").

For every ordered list whose items are single tokens of the model's vocabulary (number words, digits,
days, months, letters, in the spellings the tokenizer keeps whole: :mod:`headlens.probes.ordinal`), item
``i``'s effective embedding goes through the head's OV, the folded final norm and the unembedding
(:mod:`headlens.readout.ov`); among the logits of the list's *other* tokens, a hit is item ``i + 1`` alone
at the top (the last item has no successor and is not scored). score = hits over the items of every list;
chance is ``1 / (n - 1)`` per item of a list of ``n``, averaged over the items.

The null is the same argmax landing on the *predecessor*: a head that writes a token's neighbours in
embedding space, or similar tokens, scores both directions, a successor head one. A label needs the
score's interval above the predecessor's as well as τ. Each list's score per head is in the table's
provenance (``attrs["weights"]["successor"]["per_list"]``).
"""

from __future__ import annotations

from typing import Any

import torch

from headlens.detectors.base import Detector, WeightCounts
from headlens.errors import DetectorError
from headlens.probes.ordinal import ordinal_lists
from headlens.readout.ov import effective_embedding, readout

THRESHOLD = 0.4  # τ: the pattern detectors' (a head that maps 40 % of the items to the next one at least)


def _alone_at(lg: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``(..., M)`` bool: row ``i``'s logit at column ``pos[..., i]`` is its unique maximum (ties are no hit)."""
    top = lg.max(-1).values  # (..., M)
    at = lg.gather(-1, pos.clamp(0, lg.shape[-1] - 1).expand(*lg.shape[:-1]).unsqueeze(-1)).squeeze(-1)
    return (at == top) & ((lg == top[..., None]).sum(-1) == 1)


def _padded(lists: list) -> tuple[torch.Tensor, torch.Tensor]:
    """``(J, M)`` long: each list's items' positions in the concatenation (-1 past its end), and ``(J,)`` sizes."""
    sizes = torch.tensor([len(o.ids) for o in lists])
    M = int(sizes.max())
    starts = torch.cumsum(sizes, 0) - sizes
    slot = starts[:, None] + torch.arange(M)[None, :]  # (J, M)
    return torch.where(torch.arange(M)[None, :] < sizes[:, None], slot, torch.full_like(slot, -1)), sizes


def counts(model: Any) -> WeightCounts:
    """Items mapped to their successor (and, the null, to their predecessor), per head."""
    lists = ordinal_lists(model)
    if not lists:
        raise DetectorError(f"successor: no ordered list (digits, number words, days, months, letters) is made of "
                            f"single tokens of {getattr(model, 'name', 'the model')!r}'s vocabulary")
    ov = readout(model)
    ids = torch.cat([o.ids for o in lists])  # (N,) every item of every list
    e = effective_embedding(model, ids)  # (N, D)
    slot, sizes = _padded(lists)  # (J, M), (J,)
    J, M = slot.shape
    i = torch.arange(M)
    cand = (i[None, None, :] < sizes[:, None, None]) & (i[None, :, None] != i[None, None, :])  # (J, M, M): others
    U = ov.unembed[:, ids[slot.clamp_min(0)]]  # (D, J, M): each list's own tokens
    succ_ok = (i[None, :] + 1 < sizes[:, None]).double()  # (J, M): items with a successor
    pred_ok = ((i[None, :] >= 1) & (i[None, :] < sizes[:, None])).double()  # items with a predecessor
    L, H = ov.shape
    succ = torch.zeros(L, H, J, dtype=torch.float64)
    pred = torch.zeros(L, H, J, dtype=torch.float64)
    for layer in range(L):
        y = ov.writes(e, layer)[:, slot.clamp_min(0)]  # (H, J, M, D): what each head writes for each item
        lg = torch.einsum("hjmd,djc->hjmc", y, U).masked_fill(~cand, float("-inf"))  # (H, J, M, M)
        succ[layer] = (_alone_at(lg, i + 1) * succ_ok).sum(-1)  # (H, J)
        pred[layer] = (_alone_at(lg, i - 1) * pred_ok).sum(-1)
    trials = int((sizes - 1).sum())
    per_list = {o.name: (succ[..., j] / (len(o.ids) - 1)).round(decimals=4).tolist() for j, o in enumerate(lists)}
    attrs = {"lists": {o.name: list(o.items) for o in lists}, "per_list": per_list,
             "null": "the same argmax landing on the item's predecessor"}
    return WeightCounts(succ.sum(-1), trials, len(lists) / trials, pred.sum(-1), {}, attrs)


DETECTOR = Detector("successor", "weights", None, None,
                    "maps each item of an ordered list (days, months, numbers ...) to the next one",
                    weights_fn=counts, threshold=THRESHOLD)
