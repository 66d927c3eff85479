"""Where a token ranks in a head's OV logits: among the top k, or the bottom k, of the whole vocabulary?

For every head, every source row ``i`` (a token's effective embedding, :mod:`headlens.readout.ov`) and
each of its target tokens ``t_ij``, :func:`rank_hits` answers whether ``t_ij`` is among the ``k`` largest
(and the ``k`` smallest) of the row's ``V`` logits: the IOI copy score's question (Wang et al. 2022) and
copy suppression's (McDougall et al. 2023). Exactly, in float32, without a ``V x V`` matrix.

Why it looks like this:

* **The cost is the vocabulary.** A whole row costs ``D x V`` multiply-adds (28 M for SmolLM2); 270 heads
  times a few hundred sources would be a few TFLOP. Almost every (head, row) pair is decided far cheaper.
* **Screens first.** Against a fixed random subset ``S`` of the vocabulary (1024 tokens), factored as
  ``a @ (W_O U_S)`` (``a`` is the row's ``d_head`` value vector, so ``W_O U_S`` is shared by every row of a
  head): if ``k`` tokens of ``S`` beat the target by more than float32's rounding bound, the target is
  certainly not in the top ``k`` (likewise below, for the bottom ``k``). The rows left open go through a
  second, larger subset (8192 tokens). A subset only decides how much work is saved, never the answer.
* **Then the whole row**, for the few pairs still open (the true hits and the near misses): one matmul
  per chunk of rows, every comparison inside it. Ties count against the target, so a head that writes
  nothing ranks no token in its top ``k``.
* **A sample of sources, every target.** :func:`self_ranks` ranks each head's own token for a few hundred
  ordinary tokens drawn without replacement (the interval is over tokens), against the whole vocabulary,
  and the same for a null that pairs each source with another sampled token.
* **Centred unembedding.** Subtracting the mean column from ``W_U`` changes every logit of a row by the
  same amount (no rank moves) and keeps the rounding bound small.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from headlens.errors import DetectorError
from headlens.progress import report
from headlens.readout.ov import OVReadout, effective_embedding, memo, readout

SCREENS = (1024, 8192)  # vocabulary tokens in the first screen (every pair) and the second (the open pairs)
EPS32 = 2.0**-24  # float32's unit roundoff: a dot product of length n errs by at most n * EPS32 * sum |x_i y_i|
ROW_BYTES = 2**25  # rows of logits held at once: (R, m) float32
N_TOKENS = 256  # sampled source tokens: a 95 % interval of +-0.06 at a score of 0.5


@dataclass(frozen=True)
class RankHits:
    """Whether each target is among the ``k`` largest (``top``) / smallest (``bottom``) logits of its row.

    Attributes:
        top: ``(L, H, n, T)`` bool.
        bottom: ``(L, H, n, T)`` bool.
        whole_rows: how many (head, source) pairs needed their whole row (the screens settled the rest).
    """

    top: torch.Tensor
    bottom: torch.Tensor
    whole_rows: int


def rank_hits(ov: OVReadout, e: torch.Tensor, targets: torch.Tensor, k: int = 5, seed: int = 0) -> RankHits:
    """For every head, whether ``targets[i, j]`` is among the ``k`` largest / smallest logits of source row ``i``.

    Args:
        ov: the folded OV circuits (:func:`headlens.readout.ov.readout`).
        e: ``(n, D)`` the sources' effective embeddings.
        targets: ``(n, T)`` long token ids, each ranked in the row of its source.
        k: the rank cut-off (5: the IOI copy score's top 5).
        seed: picks the screens' subsets (the answer does not depend on it).

    >>> ov = OVReadout(torch.eye(3)[None, None, :, :2], torch.eye(3)[None, None, :2], torch.eye(3), torch.zeros(1).long())
    >>> hits = rank_hits(ov, torch.eye(3), torch.tensor([[0], [1], [2]]), k=1)
    >>> hits.top[0, 0, :, 0].tolist()  # the head copies x0 and x1, and writes nothing for x2
    [True, True, False]
    """
    L, H = ov.shape
    n, T = targets.shape
    U = ov.unembed - ov.unembed.mean(1, keepdim=True)  # (D, V): minus a constant per row, no rank moves
    V = U.shape[1]
    umax = U.norm(dim=0).max()
    order = torch.randperm(V, generator=torch.Generator().manual_seed(seed))
    screens = [order[:m] for m in SCREENS if 4 * m < V]  # a small vocabulary is cheaper to read whole
    maybe = torch.ones(L, H, n, T, 2, dtype=torch.bool)  # (..., top / bottom) not yet ruled out
    rows, ys = [], []
    U0 = U[:, screens[0]].contiguous() if screens else None  # (D, m)
    Ut = U[:, targets]  # (D, n, T): the targets' columns
    wo_norm = ov.w_o.flatten(2).norm(dim=-1)  # (L, H): |W_O|_F of every head
    values = (e @ ov.w_v.permute(2, 0, 1, 3).flatten(1)).unflatten(1, ov.w_v.shape[:2] + ov.w_v.shape[3:])
    for layer in range(L):
        a = values[:, layer, ov.kv].transpose(0, 1)  # (H, n, dh): each query head's value vector for each source
        y = a @ ov.w_o[layer]  # (H, n, D): what it writes
        if U0 is not None:
            lt = torch.einsum("hnd,dnt->hnt", y, Ut)  # (H, n, T): the targets' logits
            bound = a.norm(dim=-1) * wo_norm[layer][:, None] * umax  # (H, n) >= |logit|
            tol = 4 * sum(ov.w_o.shape[2:]) * EPS32 * bound  # (H, n): both ways of forming a logit
            maybe[layer] = _ruled_in(a @ (ov.w_o[layer] @ U0), lt, tol, k)  # subset logits through d_head
        h, i = maybe[layer].flatten(2).any(-1).nonzero(as_tuple=True)  # (p,) each: the pairs left open
        rows.append(torch.stack([torch.full_like(h, layer), h, i]))
        ys.append(y[h, i])  # (p, D)
        report(layer + 1, L, "ranking the vocabulary, layer by layer")
    idx = tuple(torch.cat(rows, 1))  # (l, h, i) of the open pairs
    y = torch.cat(ys)  # (P, D)
    for S in screens[1:]:
        maybe[idx] &= _direct(y, targets[idx[2]], U, S, k, umax)
        keep = maybe[idx].flatten(1).any(-1)  # (P,)
        idx, y = tuple(r[keep] for r in idx), y[keep]
    maybe[idx] &= _direct(y, targets[idx[2]], U, None, k, umax)
    out = torch.zeros_like(maybe)
    out[idx] = maybe[idx]
    return RankHits(out[..., 0], out[..., 1], len(idx[0]))


def _ruled_in(lg: torch.Tensor, lt: torch.Tensor, tol: torch.Tensor, k: int) -> torch.Tensor:
    """``(..., T, 2)`` bool: targets a subset's logits ``lg`` ``(..., m)`` cannot rule out of the top / bottom ``k``.

    ``lt`` ``(..., T)`` the targets' logits, ``tol`` ``(...)`` the rounding bound. Out of the top ``k`` when the
    subset's k-th largest logit beats the target by more than the bound (likewise for the bottom).
    """
    hi = lg.topk(k, dim=-1).values[..., -1:]  # (..., 1): the subset's k-th largest
    lo = lg.topk(k, dim=-1, largest=False).values[..., -1:]
    return torch.stack([hi <= lt + tol[..., None], lo >= lt - tol[..., None]], -1)


def _direct(y: torch.Tensor, targets: torch.Tensor, U: torch.Tensor, S: torch.Tensor | None, k: int,
            umax: torch.Tensor) -> torch.Tensor:
    """``(P, T, 2)`` bool: for rows ``y`` ``(P, D)``, targets not ruled out by subset ``S`` or, when ``S`` is
    None, exactly in the top / bottom ``k`` of the whole row (ties against the target)."""
    P, T = targets.shape
    out = torch.zeros(P, T, 2, dtype=torch.bool)
    Us = U if S is None else U[:, S].contiguous()  # (D, m)
    step = max(1, ROW_BYTES // (4 * Us.shape[1]))
    # one block of logits, reused: a fresh 32 MiB block a chunk would be mapped and faulted in again every time
    buf = torch.empty(min(step, P), Us.shape[1], dtype=y.dtype, device=y.device)
    for r0 in range(0, P, step):
        yc, tc = y[r0:r0 + step], targets[r0:r0 + step]  # (R, D), (R, T)
        lg = torch.matmul(yc, Us, out=buf[:len(yc)])  # (R, m): the same product as yc @ Us
        if S is None:  # in the top k <=> fewer than k others at least as high <=> the (k+1)-th largest is lower
            lt = lg.gather(1, tc)  # (R, T): the same numbers the comparison reads
            hi = lg.topk(k + 1, dim=-1).values[:, -1:]  # (R, 1)
            lo = lg.topk(k + 1, dim=-1, largest=False).values[:, -1:]
            out[r0:r0 + step] = torch.stack([hi < lt, lo > lt], -1)
        else:
            lt = torch.einsum("rd,drt->rt", yc, U[:, tc])  # (R, T)
            tol = 4 * U.shape[0] * EPS32 * yc.norm(dim=-1) * umax  # (R,): both logits' rounding
            out[r0:r0 + step] = _ruled_in(lg, lt, tol, k)
    return out


@dataclass(frozen=True)
class SelfRanks:
    """How often each head ranks the token it attends to among its own top / bottom ``k`` logits.

    Attributes:
        tokens: ``(n,)`` the sampled source tokens.
        null_tokens: ``(n,)`` the null's target for each source: another sampled token (the vocabulary's rows
            shuffled), so the null keeps each head's rows and breaks only the pairing of read and write.
        top, bottom: ``(L, H)`` float64: sources whose own token is among the head's top / bottom ``k``.
        null_top, null_bottom: ``(L, H)`` float64: the same counts for the null's targets.
        k: the rank cut-off.
        d_vocab: the vocabulary the ranks are taken over.
        whole_rows: (head, source) pairs that needed their whole row (cost, for benchmarks).
    """

    tokens: torch.Tensor
    null_tokens: torch.Tensor
    top: torch.Tensor
    bottom: torch.Tensor
    null_top: torch.Tensor
    null_bottom: torch.Tensor
    k: int
    d_vocab: int
    whole_rows: int

    @property
    def n(self) -> int:
        return len(self.tokens)

    def provenance(self) -> dict[str, Any]:
        """What the table's provenance records about the sample."""
        return {"k": self.k, "n_tokens": self.n, "d_vocab": self.d_vocab,
                "null": "each source's row ranked at another sampled token (the vocabulary's rows shuffled)"}


def self_ranks(model: Any, n_tokens: int = N_TOKENS, k: int = 5, seed: int = 0) -> SelfRanks:
    """Rank every head's own token, and the null's, over ``n_tokens`` sampled ordinary tokens (module docstring).

    ``ov_copying`` and ``ov_suppression`` read the same ranks: the last result is kept per model object and
    reused while its weights are unchanged (:func:`headlens.readout.ov.memo`).
    """
    return memo(model, "self_ranks", (n_tokens, k, seed), lambda: _self_ranks(model, n_tokens, k, seed))


def _self_ranks(model: Any, n_tokens: int, k: int, seed: int) -> SelfRanks:
    from headlens.models.vocab import vocab

    pool = torch.tensor(vocab(model).ordinary, dtype=torch.long)
    gen = torch.Generator().manual_seed(seed)
    tokens = pool[torch.randperm(len(pool), generator=gen)[:n_tokens]]  # (n,) without replacement
    order = torch.randperm(len(tokens), generator=gen)
    null = torch.empty_like(tokens)
    null[order] = tokens[order.roll(-1)]  # each source's null target: the next sampled token in a random cycle
    ov = readout(model)
    if ov.unembed.shape[1] <= k + 1:
        raise DetectorError(f"a top-{k} rank needs more than {k + 1} tokens; the vocabulary has {ov.unembed.shape[1]}")
    hits = rank_hits(ov, effective_embedding(model, tokens), torch.stack([tokens, null], 1), k=k, seed=seed)
    top, bot = hits.top.double().sum(2), hits.bottom.double().sum(2)  # (L, H, 2): own token, null target
    return SelfRanks(tokens, null, top[..., 0], bot[..., 0], top[..., 1], bot[..., 1], k, ov.unembed.shape[1],
                     hits.whole_rows)
