"""Probes: token batches a scan runs, each built through the model's own tokenizer.

A probe is a list of prompts (1-D token id tensors with the model's specials around them)
plus per-position annotations (bracket matches). Which detector reads which probe:

* ``random_tokens``: ordinary ids drawn **without replacement** (no accidental repeats, no
  special tokens): previous/next/current/first token. Longer than the vocabulary, they fill
  ``seq_len`` with replacement, repeats at least half the vocabulary apart (``draw_tokens``).
* ``repeated_segments``: ``[BOS] p + r + r`` with p and r drawn jointly without replacement,
  the repeat length and the offset ``len(p)`` varying per prompt (so a fixed-offset head cannot
  pass as an induction head): duplicate token, induction. Past twice the vocabulary, r is up to
  half of ``seq_len``, drawn with replacement the same way.

Every generated probe fills ``seq_len`` and says how it drew its tokens in ``settings``;
:func:`short_of` names a probe that could not (``classify`` warns once).
* ``brackets``: balanced strings over every bracket pair the tokenizer keeps as one token each,
  with filler; matches are computed on the *token* sequence, so they are right whatever the
  tokenizer did: bracket matching (and its hard subset).
* ``prompts``: the user's texts; every detector whose targets exist in them is scored.
* ``stdlib``: windows of real Python source from held-out files of the standard library
  (on every machine, and never in the ``code`` zoo model's training split), read like the
  user's texts; brackets are Python's ``()[]{}`` (``<`` and ``>`` are operators there).

Model calls: none, apart from tokenization.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from headlens.errors import ProbeError
from headlens.models.vocab import Vocab, encode_body, token_strings, vocab

PROBE_NAMES = ("random_tokens", "repeated_segments", "brackets", "prompts", "stdlib", "needle")
CORPORA = ("stdlib",)  # real text every machine has, for ``classify(corpus=...)``
PYTHON_PAIRS = ("()", "[]", "{}")


@dataclass
class Probe:
    """Prompts of one kind, with the annotations some detectors need.

    Attributes:
        name: one of ``PROBE_NAMES``.
        prompts: 1-D long tensors (specials included), possibly of different lengths.
        annotations: name -> one 1-D long tensor per prompt (``-1`` = nothing at that position).
        settings: how the probe was made (goes into the table's provenance).
    """

    name: str
    prompts: list[torch.Tensor]
    annotations: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

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


# -- generated probes ---------------------------------------------------------------------------
def _body_budget(v: Vocab, seq_len: int) -> int:
    budget = seq_len - v.n_special_positions
    if budget < 4:
        raise ProbeError(f"seq_len={seq_len} leaves {budget} ordinary positions; need at least 4")
    return budget


def draw_tokens(pool: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` ids from ``pool``: without replacement while ``n <= len(pool)`` (no repeats at all);
    beyond that, a chain of permutations in which every id comes back no sooner than
    ``len(pool) // 2 + 1`` positions later (each next permutation shuffles the previous one's
    first half among its first half and its second half among its second half).

    >>> ids = draw_tokens(torch.arange(10), 50, torch.Generator().manual_seed(0))
    >>> gaps = [int(d) for v in range(10) for d in (ids == v).nonzero().reshape(-1).diff()]
    >>> len(ids), min(gaps) >= 6
    (50, True)
    """
    V = len(pool)
    perm = pool[torch.randperm(V, generator=gen)]
    if n <= V:
        return perm[:n]
    h = V // 2
    parts = [perm]
    while sum(len(p) for p in parts) < n:
        last = parts[-1]
        parts.append(torch.cat([last[:h][torch.randperm(h, generator=gen)],
                                last[h:][torch.randperm(V - h, generator=gen)]]))
    return torch.cat(parts)[:n]


def _draw_note(n: int, pool: int) -> str:
    return ("without replacement" if n <= pool else
            f"with replacement: permutations of the {pool} ordinary ids chained so a repeat is >= {pool // 2 + 1} apart")


def random_tokens(model: Any, n_prompts: int, seq_len: int, gen: torch.Generator) -> Probe:
    """Ordinary tokens filling ``seq_len``: without replacement up to the vocabulary size, then
    with replacement, repeats kept at least half the vocabulary apart (:func:`draw_tokens`)."""
    v = vocab(model)
    pool = torch.tensor(v.ordinary, dtype=torch.long)
    body = _body_budget(v, seq_len)
    prompts = [torch.tensor(v.wrap(draw_tokens(pool, body, gen).tolist())) for _ in range(n_prompts)]
    return Probe("random_tokens", prompts,
                 settings={"seq_len": seq_len, "body_len": body, "draw": _draw_note(body, len(pool))})


def repeated_segments(model: Any, n_prompts: int, seq_len: int, gen: torch.Generator) -> Probe:
    """``p + r + r`` with repeat length and offset ``len(p)`` drawn per prompt.

    Up to twice the vocabulary, p and r are drawn jointly without replacement (no repeat but the
    planted one). Longer prompts fill ``seq_len``: r is up to half the body, drawn with replacement
    by :func:`draw_tokens` (the planted copy lies ``len(r)`` tokens back; accidental repeats inside
    p + r are at least half the vocabulary apart and count as induction targets by definition), and
    ``len(p) = seq_len - 2 len(r)`` fills the length.
    """
    v = vocab(model)
    pool = torch.tensor(v.ordinary, dtype=torch.long)
    budget = _body_budget(v, seq_len)
    long = budget // 2 > len(pool)
    max_r = budget // 2 if long else min(budget // 2, len(pool))
    min_r = max(2, max_r // 3)
    prompts = []
    for _ in range(n_prompts):
        r_len = int(torch.randint(min_r, max_r + 1, (1,), generator=gen))
        if long:  # fill seq_len: the offset varies with r_len
            offset = budget - 2 * r_len
        else:
            max_off = min(budget - 2 * r_len, len(pool) - r_len)
            offset = int(torch.randint(0, max_off + 1, (1,), generator=gen))
        draw = draw_tokens(pool, offset + r_len, gen)  # without replacement while it fits the pool
        r = draw[offset:].tolist()
        prompts.append(torch.tensor(v.wrap(draw[:offset].tolist() + r + r)))
    return Probe("repeated_segments", prompts,
                 settings={"seq_len": seq_len, "repeat_len": [min_r, max_r], "n_repeats": 2,
                           "max_len": seq_len, "draw": _draw_note(budget if long else 0, len(pool))})


def _dyck_units(n_units: int, n_pairs: int, filler_p: float, max_depth: int,
                gen: torch.Generator) -> list[tuple[str, int]]:
    """A balanced sequence of ("open"|"close"|"fill", pair index) units of length ``n_units``.

    With filler (``filler_p > 0``) a closer never directly follows its own opener, so that a
    previous-token head cannot pass as a bracket-matching head.
    """
    gap = 1 if filler_p > 0 else 0  # units kept between an opener and its closer
    units: list[tuple[str, int]] = []
    stack: list[int] = []
    for i in range(n_units):
        left = n_units - i  # units still to place, this one included
        u, coin = torch.rand(2, generator=gen).tolist()
        can_open = len(stack) < max_depth and left - len(stack) >= 2 + gap  # room to close it later
        just_opened = bool(units) and units[-1][0] == "open"
        if len(stack) >= left:
            kind = "close"
        elif u < filler_p or not (can_open or stack) or (gap and just_opened and not can_open):
            kind = "fill"
        elif can_open and (not stack or coin < 0.5 or (gap and just_opened)):
            kind = "open" if not (gap and just_opened and coin < 0.5) else "fill"
        else:
            kind = "close"
        if kind == "open":
            stack.append(int(torch.randint(0, n_pairs, (1,), generator=gen)))
            units.append(("open", stack[-1]))
        elif kind == "close":
            units.append(("close", stack.pop()))
        else:
            units.append(("fill", -1))
    return units


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


def brackets(model: Any, n_prompts: int, seq_len: int, gen: torch.Generator,
             filler_p: float = 0.3, max_depth: int = 8) -> Probe:
    """Balanced bracket strings with filler, written as text and tokenized by the model."""
    v = vocab(model)
    if not v.brackets:
        raise ProbeError(
            f"model {getattr(model, 'name', '?')!r} has no bracket pair its tokenizer keeps as single "
            f"tokens (tried {', '.join(('()', '[]', '{}', '<>'))}); bracket_matching cannot be probed"
        )
    strings = token_strings(model)
    budget = _body_budget(v, seq_len)
    filler = torch.tensor(v.filler or [-1], dtype=torch.long)
    prompts, matches, hards = [], [], []
    for _ in range(n_prompts):
        units = _dyck_units(budget, len(v.brackets), filler_p if v.filler else 0.0, max_depth, gen)
        words = []
        for kind, t in units:
            if kind == "fill":
                words.append(strings[int(filler[int(torch.randint(0, len(filler), (1,), generator=gen))])])
            else:
                words.append(strings[v.brackets[t][0 if kind == "open" else 1]])
        body = encode_body(model, v.sep.join(words))[:budget]
        ids = v.wrap(body)
        m, h = bracket_annotations(ids, v.brackets)
        prompts.append(torch.tensor(ids))
        matches.append(torch.tensor(m))
        hards.append(torch.tensor(h))
    pairs = ["".join(strings[i] for i in p) for p in v.brackets]
    return Probe("brackets", prompts, {"bracket_match": matches, "bracket_hard": hards},
                 settings={"seq_len": seq_len, "pairs": pairs, "filler_p": filler_p, "max_depth": max_depth})


def short_of(probe: Probe, seq_len: int) -> str | None:
    """One line when ``probe``'s longest prompt is shorter than ``seq_len``, else None."""
    longest = int(probe.settings.get("max_len", max((len(p) for p in probe.prompts), default=0)))
    if probe.name == "prompts" or longest >= seq_len:
        return None
    return (f"the {probe.name} probe reached {longest} of the {seq_len} tokens asked for "
            f"({probe.settings.get('why_short', 'the source ran out')})")


# -- the user's texts ---------------------------------------------------------------------------
def read_prompts(path: str | Path) -> list[str]:
    """Texts from a file: one prompt per line, or JSONL objects with a ``"text"`` field.

    Blank lines are skipped; a file with no prompt at all is a ``ProbeError``.
    """
    p = Path(path)
    if not p.is_file():
        raise ProbeError(f"prompts file {str(path)!r} does not exist")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ProbeError(f"prompts file {str(path)!r} is unreadable as UTF-8 text ({err})") from None
    texts = []
    jsonl = p.suffix == ".jsonl" or next((ln.lstrip().startswith("{") for ln in lines if ln.strip()), False)
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if jsonl:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise ProbeError(f"{str(path)!r} line {n} is not valid JSON ({err.msg})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                raise ProbeError(f'{str(path)!r} line {n}: expected an object with a string "text" field')
            line = obj["text"]
        if line.strip():
            texts.append(line)
    if not texts:
        raise ProbeError(f"prompts file {str(path)!r} has no prompts (empty or only blank lines)")
    return texts


def text_prompts(model: Any, texts: list[str], truncate: bool = False) -> Probe:
    """The user's texts, each with the model's specials around it.

    A text longer than the model's context is refused (``ProbeError``) unless ``truncate``,
    which cuts it to fit (the caller warns).
    """
    v = vocab(model)
    n_ctx = int(model.cfg.n_ctx)
    room = n_ctx - v.n_special_positions
    prompts, matches, hards, n_cut = [], [], [], 0
    for i, text in enumerate(texts):
        if not text.strip():
            raise ProbeError(f"prompt {i + 1} is empty")
        body = encode_body(model, text)
        if len(body) > room:
            if not truncate:
                raise ProbeError(
                    f"prompt {i + 1} is {len(body) + v.n_special_positions} tokens long; the model's context "
                    f"is n_ctx={n_ctx}; shorten it or pass --truncate to cut it to fit"
                )
            body, n_cut = body[:room], n_cut + 1
        ids = v.wrap(body)
        m, h = bracket_annotations(ids, v.brackets)
        prompts.append(torch.tensor(ids, dtype=torch.long))
        matches.append(torch.tensor(m))
        hards.append(torch.tensor(h))
    return Probe("prompts", prompts, {"bracket_match": matches, "bracket_hard": hards},
                 settings={"n_texts": len(texts), "n_truncated": n_cut})


def stdlib_body(model: Any, stream: torch.Tensor, start: int, span: int, n: int, what: str = "corpus") -> list[int]:
    """Up to ``n`` body token ids of held-out stdlib bytes ``stream``: ``span`` bytes from the first
    line that starts after ``start`` (the stream must hold ``start + 2 * span`` bytes)."""
    chunk = bytes(stream[start:start + 2 * span].tolist())
    chunk = chunk[chunk.find(b"\n") + 1:][:span]  # from the next line on
    try:
        return encode_body(model, chunk.decode("utf-8", errors="ignore"))[:n]
    except ProbeError as err:
        raise ProbeError(f"the stdlib {what} is Python source, which this model cannot read: {err}") from None


def stdlib_windows(model: Any, n_prompts: int, seq_len: int, gen: torch.Generator) -> Probe:
    """``n_prompts`` windows of held-out standard-library source, each starting at a line and
    ``seq_len`` tokens long (specials included), tokenized by the model."""
    from headlens.probes import data

    v = vocab(model)
    budget = _body_budget(v, seq_len)
    strings = token_strings(model)
    pairs = tuple(p for p in v.brackets if strings[p[0]] + strings[p[1]] in PYTHON_PAIRS)
    stream = data.stdlib_corpus().heldout  # (N,) uint8: held-out files joined by blank lines
    span = min(8 * budget, len(stream) // 2 - 1)  # bytes enough for ``budget`` tokens (if the corpus has them)
    prompts, matches, hards = [], [], []
    starts = torch.randint(0, len(stream) - 2 * span, (n_prompts,), generator=gen).tolist()
    for start in starts:
        ids = v.wrap(stdlib_body(model, stream, start, span, budget))
        m, h = bracket_annotations(ids, pairs)
        prompts.append(torch.tensor(ids, dtype=torch.long))
        matches.append(torch.tensor(m))
        hards.append(torch.tensor(h))
    return Probe("stdlib", prompts, {"bracket_match": matches, "bracket_hard": hards},
                 settings={"seq_len": seq_len, "source": "held-out Python standard library files",
                           "why_short": f"the held-out stdlib text is {len(stream)} bytes",
                           "pairs": ["".join(strings[i] for i in p) for p in pairs]})
