"""What every probe is: a list of prompts plus per-position annotations, and how a batch of them is
padded (:class:`Probe`, :class:`ProbeBatch`, :func:`collate`). The builders are in
:mod:`headlens.probes.generated` and :mod:`headlens.probes.text`; which detector reads which probe is
said in :mod:`headlens.probes`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from headlens.errors import ProbeError
from headlens.models.vocab import Vocab

PROBE_NAMES = ("random_tokens", "repeated_segments", "brackets", "prompts", "stdlib", "prose", "needle", "ioi")
CORPORA = ("stdlib", "prose")  # real text every machine has (Python source; English documentation prose)
PYTHON_PAIRS = ("()", "[]", "{}")


@dataclass
class Probe:
    """Prompts of one kind, with the annotations some detectors need.

    Attributes:
        name: one of ``PROBE_NAMES``.
        prompts: 1-D long tensors (specials included), possibly of different lengths.
        annotations: name -> one 1-D long tensor per prompt (``-1`` = nothing at that position).
        settings: how the probe was made (goes into the table's provenance).
        positions: named positions per prompt, name -> ``(N,)`` long token index in each prompt
            (``-1`` where a prompt has none): IOI's ``IO``, ``S1``, ``S1+1``, ``S2``, ``END``; circuits
            restrict edges to them (``receiver_pos`` / ``sender_pos``).
    """

    name: str
    prompts: list[torch.Tensor]
    annotations: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    positions: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.prompts)


@dataclass
class ProbeBatch:
    """A right-padded batch of prompts, with the masks every detector shares.

    Attributes:
        tokens: ``(B, T)`` ids, padded on the right.
        lengths: ``(B,)`` real lengths.
        valid: ``(B, T)`` True at real (non-pad) positions.
        special: ``(B, T)`` True at special-token positions (BOS/CLS/SEP) and pads.
        causal: whether position q sees only keys ``k <= q``.
        annotations: name -> ``(B, T)`` long, ``-1`` where absent or padded.
        rows: ``(r0, r1)``: the query rows a *windowed* detector is asked for (its targets are then
            ``(B, r1 - r0, M)``); None means all rows. Keys are always the whole prompt.
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    valid: torch.Tensor
    special: torch.Tensor
    causal: bool
    annotations: dict[str, torch.Tensor] = field(default_factory=dict)
    rows: tuple[int, int] | None = None

    @property
    def row_range(self) -> tuple[int, int]:
        """``(r0, r1)``: the query rows asked for (all of them unless ``rows`` is set)."""
        return self.rows if self.rows is not None else (0, self.tokens.shape[1])

    def window(self, r0: int, r1: int) -> ProbeBatch:
        """The same batch, asking a windowed detector for query rows ``r0 .. r1-1`` only."""
        T = self.tokens.shape[1]
        return dataclasses.replace(self, rows=(min(r0, T), min(r1, T)))

    @property
    def query_ok(self) -> torch.Tensor:
        """``(B, T)``: the rows a detector may count (real, non-special positions)."""
        return self.valid & ~self.special

    @property
    def n_visible(self) -> torch.Tensor:
        """``(B, T)`` float: how many real keys each query position sees (uniform baseline)."""
        T = self.tokens.shape[1]
        if self.causal:
            return torch.arange(1, T + 1, dtype=torch.float64).expand(len(self.lengths), T)
        return self.lengths.to(torch.float64)[:, None].expand(-1, T)


def collate(probe: Probe, rows: range | list[int], causal: bool, special_ids: frozenset[int],
            pad_id: int, device: torch.device | str = "cpu") -> ProbeBatch:
    """Right-pad ``probe.prompts[rows]`` into a :class:`ProbeBatch`."""
    seqs = [probe.prompts[i] for i in rows]
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    T = int(lengths.max())
    tokens = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    for b, s in enumerate(seqs):
        tokens[b, : len(s)] = s
    valid = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    special = torch.isin(tokens, torch.tensor(sorted(special_ids), dtype=torch.long)) | ~valid
    annotations = {}
    for name, values in probe.annotations.items():
        ann = torch.full((len(seqs), T), -1, dtype=torch.long)
        for b, i in enumerate(rows):
            ann[b, : len(values[i])] = values[i]
        annotations[name] = ann.to(device)
    return ProbeBatch(tokens.to(device), lengths.to(device), valid.to(device), special.to(device),
                      causal, annotations)


def body_budget(v: Vocab, seq_len: int) -> int:
    budget = seq_len - v.n_special_positions
    if budget < 4:
        raise ProbeError(f"seq_len={seq_len} leaves {budget} ordinary positions; need at least 4")
    return budget


def bracket_annotations(ids: list[int], pairs: tuple[tuple[int, int], ...]) -> tuple[list[int], list[int]]:
    """For each position: the matching opener's position (``-1`` if none), and the same for the hard subset.

    A closer is *hard* when its opener is not the nearest preceding opener (an already closed
    opener sits between them). In real text not every opener is a bracket (``a < b`` in code):
    a closer whose opener is deeper in the stack drops the unclosed openers above it, and a
    closer with no opener of its type is ignored.

    >>> bracket_annotations([9, 1, 3, 4, 2], ((1, 2), (3, 4)))  # x ( [ ] )
    ([-1, -1, -1, 2, 1], [-1, -1, -1, -1, 1])
    >>> bracket_annotations([1, 9, 3, 9, 2], ((1, 2), (3, 4)))  # ( a [ b )   the [ is dropped
    ([-1, -1, -1, -1, 0], [-1, -1, -1, -1, -1])
    """
    kind = {o: (t, True) for t, (o, _) in enumerate(pairs)} | {c: (t, False) for t, (_, c) in enumerate(pairs)}
    match, hard = [-1] * len(ids), [-1] * len(ids)
    stack: list[list[int]] = []  # [position, pair type, 1 if a group closed inside it]
    for q, tid in enumerate(ids):
        if tid not in kind:
            continue
        t, is_open = kind[tid]
        if is_open:
            stack.append([q, t, 0])
            continue
        depth = next((d for d in range(len(stack) - 1, -1, -1) if stack[d][1] == t), None)
        if depth is None:
            continue  # a stray closer
        k, _, closed_inside = stack[depth]
        del stack[depth:]
        match[q] = k
        hard[q] = k if closed_inside else -1
        if stack:
            stack[-1][2] = 1
    return match, hard


def short_of(probe: Probe, seq_len: int) -> str | None:
    """One line when ``probe``'s longest prompt is shorter than ``seq_len``, else None."""
    longest = int(probe.settings.get("max_len", max((len(p) for p in probe.prompts), default=0)))
    if probe.name in ("prompts", "ioi") or longest >= seq_len:  # texts and templates are as long as they are
        return None
    return (f"the {probe.name} probe reached {longest} of the {seq_len} tokens asked for "
            f"({probe.settings.get('why_short', 'the source ran out')})")
