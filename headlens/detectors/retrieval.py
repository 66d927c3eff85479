"""retrieval (Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context Factuality",
github.com/nightdessert/Retrieval_Head): at a copy step of a needle, the head's top-1 key is the
needle token being copied.

On the needle-in-a-haystack probe (:mod:`headlens.probes.haystack`) the row q holding ``N[i]`` in the
copy predicts ``N[i+1]``; its one target is the position of ``N[i+1]`` in the inserted needle.
Unlike every other detector this one is scored by **top-1**, not by attention mass (``kind``
``"top1"``, :mod:`headlens.scoring.top1`): a copy step counts 1 when the head's largest attention
weight falls on the target, and the score is the fraction of copy steps that do. Uniform attention
picks the target with probability ``1 / (keys visible from q)``: the baseline.

Wu et al. call a head a retrieval head at score > 0.1 (with greedy decoding, counting only trials
whose answer is recalled); headlens labels with its own rule (the strength's CI low end >= κ, docs/scores.md) and
reports heads above 0.1 next to it (``attrs["retrieval_wu_2024"]``). Scored when asked for by name
(``detectors=["retrieval"]``): its probe is long, and a top-1 lift (baseline ``1 / visible keys``) is on
another scale than the mass detectors', so it would top every induction head's "strongest label".
"""

from __future__ import annotations

import torch

from headlens.detectors.base import Detector, finish_index
from headlens.probes.base import ProbeBatch

WU_THRESHOLD = 0.1


def targets(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, 1)``: the needle position of the token a copy step predicts (``-1`` elsewhere).

    >>> from headlens.probes.base import ProbeBatch
    >>> t = torch.tensor([[9, 5, 6, 7, 1, 5, 6, 7]]); v = torch.ones(1, 8, dtype=torch.bool)
    >>> nxt = torch.tensor([[-1, -1, -1, -1, -1, 2, 3, -1]])  # row 5 holds N[0]: N[1] sits at 2
    >>> targets(ProbeBatch(t, torch.tensor([8]), v, t == 9, True, {"needle_next": nxt}))[0, :, 0].tolist()
    [-1, -1, -1, -1, -1, 2, 3, -1]
    """
    nxt = batch.annotations.get("needle_next")
    if nxt is None:  # not a needle probe (the user's texts): no copy steps
        return torch.full((*batch.tokens.shape, 1), -1, dtype=torch.long, device=batch.tokens.device)
    return finish_index(nxt, batch)


DETECTOR = Detector("retrieval", "top1", targets, "needle",
                    "top-1 attention on the needle token being copied (Wu et al. 2024)", default=False)
