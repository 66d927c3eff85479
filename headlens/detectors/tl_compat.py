"""TransformerLens ``head_detector.detect_head`` masks, for ``tl_compatible`` scans.

TL (4.3) scores a head on one prompt as ``Σ(A∘D) / ΣA`` over *all* rows of the prompt (BOS
included, rows without a target included), with lower-triangular masks D built from the raw
token ids (specials included), and averages that per-prompt number over prompts. Its masks:

* ``previous_token_head``: D[q, q-1] = 1;
* ``duplicate_token_head``: D[q, k] = 1 for k < q with x_k = x_q;
* ``induction_head``: the duplicate mask shifted one key to the right, D[q, k] = 1 for
  1 <= k <= q with x_{k-1} = x_q, k-1 < q (so k = q counts when x_{q-1} = x_q).

Here they are ``"mask"`` detectors over real positions, plus ``TL_NORM`` whose "mass" is
ΣA over the real rows (the denominator). The scan reduces them like any other mask.
"""

from __future__ import annotations

import torch

from headlens.detectors.base import Detector, lower
from headlens.probes.base import ProbeBatch

# headlens detector name -> TransformerLens HeadName
TL_NAMES = {
    "previous_token": "previous_token_head",
    "duplicate_token": "duplicate_token_head",
    "induction": "induction_head",
}


def _real(batch: ProbeBatch) -> torch.Tensor:
    T = batch.tokens.shape[1]
    return batch.valid[:, :, None] & batch.valid[:, None, :] & lower(T, batch.tokens.device)[None]  # (B, Q, K)


def previous_token_mask(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, K)``: TL's ``get_previous_token_head_detection_pattern`` on each prompt."""
    T = batch.tokens.shape[1]
    sub = lower(T, batch.tokens.device, -1) & ~lower(T, batch.tokens.device, -2)  # k = q-1
    return sub[None] & _real(batch)


def duplicate_token_mask(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, K)``: TL's ``get_duplicate_token_head_detection_pattern`` (k < q, same id)."""
    x = batch.tokens
    T = x.shape[1]
    strict = lower(T, x.device, -1)
    return (x[:, :, None] == x[:, None, :]) & strict[None] & _real(batch)


def induction_mask(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, K)``: TL's ``get_induction_head_detection_pattern`` (duplicate shifted right)."""
    dup = duplicate_token_mask(batch)
    shifted = torch.cat([torch.zeros_like(dup[:, :, :1]), dup[:, :, :-1]], dim=2)  # D[q,k] = dup[q,k-1]
    return shifted & _real(batch)


def norm_mask(batch: ProbeBatch) -> torch.Tensor:
    """``(B, Q, K)``: every real (q, k), so the reduced "mass" is ΣA over the prompt's rows."""
    return batch.valid[:, :, None] & batch.valid[:, None, :]


TL_DETECTORS: dict[str, Detector] = {
    "previous_token": Detector("previous_token", "mask", previous_token_mask, "random_tokens",
                               "TL previous_token_head"),
    "duplicate_token": Detector("duplicate_token", "mask", duplicate_token_mask, "repeated_segments",
                                "TL duplicate_token_head"),
    "induction": Detector("induction", "mask", induction_mask, "repeated_segments", "TL induction_head"),
}
TL_NORM = Detector("tl_norm", "mask", norm_mask, None, "ΣA over real rows (TL's denominator)")
