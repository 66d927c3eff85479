"""Generated probes: random tokens, repeated segments and balanced brackets, drawn through the
model's own vocabulary (see :mod:`headlens.probes` for which detector reads which probe).
"""

from __future__ import annotations

from typing import Any

import torch

from headlens.errors import ProbeError
from headlens.models.vocab import encode_body, token_strings, vocab
from headlens.probes.base import Probe, body_budget, bracket_annotations


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
    body = body_budget(v, seq_len)
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
    budget = body_budget(v, seq_len)
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


def spaced_brackets(model: Any, pairs: tuple[tuple[int, int], ...], strings: list[str]) -> dict[int, int]:
    """``{id: bracket id}`` for the brackets a subword vocabulary spells with their leading space (GPT-2's and
    SmolLM2's ``Ġ(``): text written with spaces tokenizes to those, and they are the same brackets."""
    out = {}
    for i in {i for pair in pairs for i in pair}:
        try:
            ids = encode_body(model, " " + strings[i])
        except ProbeError:  # a character-level alphabet without the space
            continue
        if len(ids) == 1 and ids[0] != i:
            out[int(ids[0])] = i
    return out


def brackets(model: Any, n_prompts: int, seq_len: int, gen: torch.Generator,
             filler_p: float = 0.3, max_depth: int = 8) -> Probe:
    """Balanced bracket strings with filler, written as text and tokenized by the model (a bracket after a
    space counts as that bracket: :func:`spaced_brackets`)."""
    v = vocab(model)
    if not v.brackets:
        raise ProbeError(
            f"model {getattr(model, 'name', '?')!r} has no bracket pair its tokenizer keeps as single "
            f"tokens (tried {', '.join(('()', '[]', '{}', '<>'))}); bracket_matching cannot be probed"
        )
    strings = token_strings(model)
    same = spaced_brackets(model, v.brackets, strings)
    budget = body_budget(v, seq_len)
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
        m, h = bracket_annotations([same.get(i, i) for i in ids], v.brackets)
        prompts.append(torch.tensor(ids))
        matches.append(torch.tensor(m))
        hards.append(torch.tensor(h))
    pairs = ["".join(strings[i] for i in p) for p in v.brackets]
    return Probe("brackets", prompts, {"bracket_match": matches, "bracket_hard": hards},
                 settings={"seq_len": seq_len, "pairs": pairs, "filler_p": filler_p, "max_depth": max_depth})
