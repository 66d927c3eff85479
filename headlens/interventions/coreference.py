"""Metrics for embedding models (``headlens.probes.coreference``): how far an encoder resolves each pronoun,
measured on its sentence and token embeddings (so an ablated head's effect gets a bootstrap CI).

Moved out of :mod:`headlens.interventions.metrics` (which re-exports :func:`coreference_margins`): those
metrics read logits, these read hidden states.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from headlens.errors import ProbeError


def _hidden_batches(model: Any, texts: Sequence[str], batch_size: int) -> Any:
    """Yield ``(hidden (B, T, d_model) float64, mask (B, T))`` per batch of texts (right-padded)."""
    if getattr(model, "output_kind", "logits") != "hidden":
        raise ProbeError(f"this metric needs an encoder that returns hidden states; {model.name!r} "
                         f"returns {getattr(model, 'output_kind', 'logits')}")
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            rows = [model.to_tokens(t)[0] for t in texts[start:start + batch_size]]
            T = max(len(r) for r in rows)
            tokens = torch.zeros(len(rows), T, dtype=torch.long, device=model.device)
            mask = torch.zeros(len(rows), T, dtype=torch.long, device=model.device)
            for i, r in enumerate(rows):
                tokens[i, : len(r)], mask[i, : len(r)] = r, 1
            yield model.forward(tokens, attention_mask=mask).double().cpu(), mask.cpu()  # (B, T, d_model)


def _mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(B, d_model)`` unit vectors: the attention-masked mean of ``(B, T, d_model)`` hidden states
    (sentence-transformers' pooling for all-MiniLM-L6-v2, then its normalisation)."""
    m = mask[:, :, None].double()  # (B, T, 1)
    return F.normalize((hidden * m).sum(1) / m.sum(1), dim=-1)  # (B, d_model)


def coreference_margins(model: Any, examples: Sequence[Any], batch_size: int = 64) -> dict[str, torch.Tensor]:
    """Two per-sentence ``(N,)`` float64 measures of how far the model resolves each pronoun,
    from one pass over the sentences and their paraphrases (positive = sides with the referent):

    * ``"sentence"``: ``cos(s, resolved) - cos(s, wrong)`` of mean-pooled sentence embeddings:
      ``s`` embeds ``"John told Mary that she needed help."``, ``resolved`` the paraphrase with
      the pronoun replaced by its referent (``"Mary needed help."``), ``wrong`` the one with the
      other candidate (``"John needed help."``);
    * ``"token"``: ``cos(h_pronoun, h_referent) - cos(h_pronoun, h_other)`` of the final hidden
      states. Caveat: it also measures lexical kinship (``she`` and ``Mary`` share gender
      features before any attention), so its clean value overstates resolution.

    Everything is embedded by the model as it is (inside ``headlens.ablate``: ablated), so a
    head that resolves pronouns should, when removed, shrink both. ``examples`` are
    :class:`headlens.probes.coreference.Example` (``text``, ``resolved``, ``wrong``, spans).
    """
    from headlens.probes.spans import annotated_probe

    n = len(examples)
    probe = annotated_probe(model, [(i, e.row()) for i, e in enumerate(examples)], "coreference")
    texts = [e.text for e in examples] + [e.resolved for e in examples] + [e.wrong for e in examples]
    pooled, token, i = [], [], 0
    for hidden, mask in _hidden_batches(model, texts, batch_size):
        pooled.append(_mean_pool(hidden, mask))  # (B, d_model)
        for h in F.normalize(hidden, dim=-1):  # (T, d_model): one text's unit token vectors
            if i < n:
                t = probe.targets[i][0]
                p = h[list(t.query)].mean(0)
                token.append(float(p @ h[list(t.keys)].mean(0) - p @ h[list(t.distractors[0])].mean(0)))
            i += 1
    emb = torch.cat(pooled)  # (3N, d_model)
    s, right, wrong = emb[:n], emb[n:2 * n], emb[2 * n:]
    return {"sentence": (s * right).sum(-1) - (s * wrong).sum(-1), "token": torch.tensor(token, dtype=torch.float64)}
