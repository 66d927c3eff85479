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
    """``(..., n)`` bool: row ``i``'s logit at column ``pos[i]`` is its unique maximum (ties are no hit)."""
    top = lg.max(-1).values  # (..., n)
    at = lg.gather(-1, pos.expand(*lg.shape[:-1]).unsqueeze(-1)).squeeze(-1)  # (..., n)
    return (at == top) & ((lg == top[..., None]).sum(-1) == 1)


def counts(model: Any) -> WeightCounts:
    """Items mapped to their successor (and, the null, to their predecessor), per head."""
    lists = ordinal_lists(model)
    if not lists:
        raise DetectorError(f"successor: no ordered list (digits, number words, days, months, letters) is made of "
                            f"single tokens of {getattr(model, 'name', 'the model')!r}'s vocabulary")
    ov = readout(model)
    e = effective_embedding(model, torch.cat([o.ids for o in lists]))  # (N, D)
    L, H = ov.shape
    succ = torch.zeros(L, H, dtype=torch.float64)
    pred = torch.zeros(L, H, dtype=torch.float64)
    per_list: dict[str, list[list[float]]] = {}
    start = 0
    for o in lists:
        n = len(o.ids)
        writes = torch.stack([ov.writes(e[start:start + n], layer) for layer in range(L)])  # (L, H, n, D)
        start += n
        lg = writes @ ov.unembed[:, o.ids]  # (L, H, n, n): the logits of the list's own tokens
        lg.diagonal(dim1=-2, dim2=-1).fill_(float("-inf"))  # the item itself is no candidate
        i = torch.arange(n)
        s = _alone_at(lg[..., :-1, :], i[:-1] + 1).double().sum(-1)  # (L, H): items 0 .. n-2
        succ += s
        pred += _alone_at(lg[..., 1:, :], i[1:] - 1).double().sum(-1)  # items 1 .. n-1
        per_list[o.name] = (s / (n - 1)).round(decimals=4).tolist()
    trials = sum(len(o.ids) - 1 for o in lists)
    attrs = {"lists": {o.name: list(o.items) for o in lists}, "per_list": per_list,
             "null": "the same argmax landing on the item's predecessor"}
    return WeightCounts(succ, trials, len(lists) / trials, pred, {}, attrs)


DETECTOR = Detector("successor", "weights", None, None,
                    "maps each item of an ordered list (days, months, numbers ...) to the next one",
                    weights_fn=counts, threshold=THRESHOLD)
