"""The rules a head's description may name: each a predicate that marks, per query, the keys it predicts.

Why it looks like this:

* **Causal pattern detectors** with a predicate (previous token, induction, duplicate token) are taken from
  the registry as they are; the fixed offsets 2 and 3 are one lambda each.
* **``induction_longest``**: induction's targets narrowed to the copies whose preceding text matches the
  text before the query longest (all of them when tied). Induction heads match prefixes (Olsson et al.
  2022) and weigh a longer match more, while ``induction`` spreads a row's mass evenly over every earlier
  copy, however short its match; on SmolLM2 the narrower rule agrees better with its induction heads
  (docs/atlas.md). Its role is ``induction`` (:data:`ROLE`).
* **``predicted_token``** (McDougall et al. 2023's copy suppression): a key holding one of the model's own
  top :data:`N_PREDICTED` next tokens at the query. Its targets need the forward's logits, so it is one of
  the :data:`LATE` rules (:mod:`headlens.atlas.heldout` keeps each layer's pattern until they are known).
"""

from __future__ import annotations

from typing import Any

import torch

from headlens.detectors.base import Detector, predicate_mask
from headlens.probes.base import ProbeBatch

RULES = ("previous_token", "induction", "duplicate_token")  # registered causal rules a description may name
OFFSETS = (2, 3)  # fixed offsets tried as rules (offset 1 is previous_token)
N_PREDICTED = 5  # "a token the model predicts": among the model's own top N_PREDICTED next tokens at the query
SMALL_VOCAB = 5000  # below this, top 1 only: a top 5 of a few dozen tokens covers much of any window
ROLE = {"induction_longest": "induction"}  # a rule's role, where it is not the rule's own name
LATE = ("predicted_token",)  # rules whose targets need the forward's own logits (the others read the tokens)


def candidate_rules() -> dict[str, Detector]:
    """name -> detector: the rules a description may name."""
    from headlens.detectors import get_detector

    rules = {name: get_detector(name) for name in RULES}
    rules["induction_longest"] = Detector("induction_longest", "mask", None, None, "attends to the token after "
                                          "the earlier copy of the current token whose preceding text matches "
                                          "longest", predicate=longest_match)
    for d in OFFSETS:
        rules[f"offset_{d}"] = Detector(f"offset_{d}", "mask", None, None, f"attends {d} tokens back",
                                        predicate=lambda batch, q, k, d=d: k == q - d)
    rules["predicted_token"] = Detector("predicted_token", "mask", None, None, "attends to an earlier copy of a "
                                        f"token the model predicts next (its top {N_PREDICTED})",
                                        predicate=predicted)
    return rules


def longest_match(batch: ProbeBatch, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``(B, C, K)``: induction's targets at q (``x_{k-1} == x_q``) whose match, counted back from ``k - 1`` and
    ``q`` while the tokens agree, is the longest of the row's (all tied ones).

    >>> from headlens.probes.base import ProbeBatch
    >>> t = torch.tensor([[9, 2, 3, 1, 5, 4, 1, 7, 2, 3, 1]]); v = torch.ones(1, 11, dtype=torch.bool)
    >>> b = ProbeBatch(t, torch.tensor([11]), v, t == 9, causal=True)
    >>> q, k = torch.arange(11)[:, None], torch.arange(11)[None, :]
    >>> longest_match(b, q, k)[0, 10].nonzero().tolist()  # "2 3 1" recurs before key 4; induction also takes 7
    [[4]]
    """
    from headlens.detectors.induction import predicate

    x, ok = batch.tokens, ~batch.special
    T = x.shape[1]
    eq = (x[:, :, None] == x[:, None, :]) & ok[:, :, None] & ok[:, None, :]  # (B, T, T): x_i == x_j, ordinary
    run = eq.long()  # (B, T, T): run[i, j] = how many tokens agree counting back from i and from j
    for i in range(1, T):
        run[:, i, 1:] *= 1 + run[:, i - 1, :-1]
    length = run[:, q[:, 0]][:, :, (k[0] - 1).clamp(min=0)]  # (B, C, K): the match behind key k's earlier copy
    hit = predicate(batch, q, k)  # (B, C, K): induction's targets
    score = torch.where(hit, length, 0)
    return hit & (score == score.amax(-1, keepdim=True))


def predicted(batch: ProbeBatch, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``(B, C, K)``: key k holds one of the model's top next-token predictions at q (annotations ``pred{i}``,
    the model's own logits on the window): the pattern of copy suppression (McDougall et al. 2023)."""
    x = batch.tokens[:, k]  # (B, 1, K)
    hit = torch.zeros(x.shape[0], q.shape[0], k.shape[1], dtype=torch.bool)
    for i in range(N_PREDICTED):
        hit |= x == batch.annotations[f"pred{i}"][:, q]  # (B, C, K)
    return hit & (k <= q - 1)


def late_rules(rules: dict[str, Detector]) -> Any:
    """The targets of the rules that read the model's own next-token predictions, from its logits ``(B, T, V)``."""
    late = {name: rule for name, rule in rules.items() if name in LATE}

    def targets(logits: torch.Tensor, batch: ProbeBatch, cells: torch.Tensor) -> dict[str, torch.Tensor]:
        top = logits.topk(N_PREDICTED if logits.shape[-1] >= SMALL_VOCAB else 1, -1).indices.cpu()  # (B, T, n)
        pred = torch.cat([top, top[..., :1].expand(*top.shape[:2], N_PREDICTED - top.shape[-1])], -1)  # (B, T, N)
        batch.annotations.update({f"pred{i}": pred[..., i] for i in range(N_PREDICTED)})
        T = cells.shape[-1]
        return {name: predicate_mask(rule.predicate, batch, 0, T, 0, T) & cells for name, rule in late.items()}
    return targets
