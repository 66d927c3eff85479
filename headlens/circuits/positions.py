"""Edges at named positions: where a sender's write enters the receiver, and where the receiver acts.

A probe names positions per prompt (``Probe.positions``: name -> ``(N,)`` token index, ``-1`` where a
prompt has none): the IOI probe's ``IO, S1, S1+1, S2, END``; a user's JSONL row names them by character
span (:mod:`headlens.probes.named`). An edge can be restricted to them:

* ``receiver_pos``: the receiver head's *query* positions whose output is patched. Everywhere else the
  receiver's output (its ``hook_z`` row) stays clean. For ``logits``: the positions whose logits move.
* ``sender_pos``: the positions of the sender's write that enter the receiver's input. A query (and the
  logits) reads the residual stream at its own position, so a ``q`` edge's ``sender_pos`` *is* its
  ``receiver_pos``; a key or value is read at other positions: ``L5H1 -> L9H9.v`` with ``sender_pos=S2``
  and ``receiver_pos=END`` is what the head at END reads from the value at S2.

``all`` (the default for both) is every position: the edge as before positions existed. A prompt without
a named position contributes nothing at that position (its mask row is empty, its effect 0).

Why it looks like this: the residual stream is position-wise, so "the direct path S -> R at positions"
needs two things only: the sender's delta masked to ``sender_pos`` (a ``(B, T)`` mask times the delta) and
the receiver's ``z`` spliced at ``receiver_pos`` (patched there, clean elsewhere). Every patcher (native,
bridge, the resumed bridge, the naive references) takes those two masks and nothing else.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from headlens.circuits.nodes import CircuitError

ALL = "all"


@dataclass(frozen=True)
class NamedPositions:
    """Named positions of a batch of prompts.

    Attributes:
        index: name -> ``(B,)`` long token index per prompt (``-1``: the prompt has none).
        shape: ``(B, T)`` of the task's tokens.

    >>> p = NamedPositions({"END": torch.tensor([3, 2])}, (2, 4))
    >>> p.mask("END").int().tolist()
    [[0, 0, 0, 1], [0, 0, 1, 0]]
    """

    index: dict[str, torch.Tensor]
    shape: tuple[int, int]

    @property
    def names(self) -> list[str]:
        return list(self.index)

    def mask(self, name: str) -> torch.Tensor | None:
        """``(B, T)`` bool, True at the named position of each prompt; None for ``all``."""
        if name == ALL:
            return None
        if name not in self.index:
            raise CircuitError(f"unknown position {name!r}; this probe names {_known(self)}")
        idx = self.index[name]
        T = self.shape[1]
        t = torch.arange(T, device=idx.device)
        return (t[None, :] == idx[:, None]) & (idx[:, None] >= 0)  # (B, T)

    def rows(self, rows: slice) -> NamedPositions:
        """The positions of prompts ``rows`` only (a block of the batch)."""
        index = {k: v[rows] for k, v in self.index.items()}
        B = len(next(iter(index.values()))) if index else len(range(*rows.indices(self.shape[0])))
        return NamedPositions(index, (B, self.shape[1]))

    def first(self, name: str) -> int:
        """The earliest index of ``name`` over the prompts that have it (0 for ``all`` or none)."""
        if name == ALL or name not in self.index:
            return 0
        idx = self.index[name]
        return int(idx[idx >= 0].min()) if bool((idx >= 0).any()) else 0


def _known(named: NamedPositions | None) -> str:
    names = [] if named is None else named.names
    return ", ".join([*names, ALL]) if names else f"none (only {ALL!r})"


def parse_positions(spec: str | Sequence[str] | None, named: NamedPositions | None) -> list[str] | None:
    """``"END,S2"`` (or a list) -> checked names, in the order given; None stays None.

    >>> parse_positions("END, all", NamedPositions({"END": torch.tensor([1])}, (1, 2)))
    ['END', 'all']
    """
    if spec is None:
        return None
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else [str(s).strip() for s in spec]
    items = [s for s in items if s]
    if not items:
        raise CircuitError(f"no positions given in {spec!r}; expected names such as 'END,S2' (or 'all')")
    for s in items:
        if s != ALL and (named is None or s not in named.index):
            raise CircuitError(f"unknown position {s!r}; the prompts name {_known(named)}")
    return list(dict.fromkeys(items))


def edge_masks(edge: object, named: NamedPositions | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(sender_mask, receiver_mask)`` of an edge, each ``(B, T)`` bool or None (every position)."""
    rp, sp = getattr(edge, "pos", ALL), getattr(edge, "sender_pos", ALL)
    if rp == ALL and sp == ALL:
        return None, None
    if named is None:
        raise CircuitError(f"edge {edge} is restricted to positions, but the prompts name none")
    return named.mask(sp), named.mask(rp)


def suffix_start(edges: Sequence[object], named: NamedPositions | None) -> int:
    """The first position at which any of ``edges`` can change the residual stream after its receiver.

    A receiver patched only at query positions ``receiver_pos`` leaves every earlier position of every later
    layer clean, so a forward resumed after it need only run positions from here on (0: all of them)."""
    if named is None:
        return 0
    return min(named.first(getattr(e, "pos", ALL)) for e in edges) if edges else 0


def with_positions(P: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
    """``(B, S')`` each prompt's positions ``P`` ``(B, S)`` and the ``extra`` ones ``(B, T)`` (all before them), in
    order, a short row padded with its last position again.

    >>> with_positions(torch.tensor([[5, 6], [4, 4]]), torch.tensor([[0, 1, 0, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0, 0]]).bool())
    tensor([[1, 5, 6, 6],
            [0, 2, 4, 4]])
    """
    T = extra.shape[1]
    m = int(extra.sum(1).max())
    ex = torch.where(extra, torch.arange(T, device=P.device), T).sort(1).values[:, :m]  # (B, m): T where none
    both = torch.cat([ex, P], 1)  # (B, m + S)
    return torch.where(both >= T, P[:, -1:], both).sort(1).values


def span_groups(span: torch.Tensor, most: int = 3, saving: float = 0.1) -> list[tuple[torch.Tensor, int]]:
    """At most ``most`` groups of prompts ``(rows, s)`` by their spans ``(B,)`` (positions each resumes), each run
    ``s`` (its longest) wide, when that saves at least ``saving`` of running all at the longest; else ``[]``.

    >>> [(r.tolist(), s) for r, s in span_groups(torch.tensor([5, 7, 5, 3, 5, 7]))]
    [([3], 3), ([0, 2, 4], 5), ([1, 5], 7)]
    """
    vals = sorted(set(span.tolist()))
    count = [int((span == v).sum()) for v in vals]
    full, best, cuts = len(span) * vals[-1], len(span) * vals[-1], ()
    for k in range(1, min(most, len(vals))):
        for c in itertools.combinations(range(1, len(vals)), k):
            bounds = (0, *c, len(vals))
            cost = sum(sum(count[a:b]) * vals[b - 1] for a, b in itertools.pairwise(bounds))
            if cost < best:
                best, cuts = cost, c
    if best > (1 - saving) * full:
        return []
    bounds = (0, *cuts, len(vals))
    return [(((span >= vals[a]) & (span <= vals[b - 1])).nonzero()[:, 0], vals[b - 1])
            for a, b in itertools.pairwise(bounds)]
