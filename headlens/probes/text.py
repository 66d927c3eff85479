"""Probes from text: the user's prompts (one per line or JSONL) and windows of real Python source
from held-out files of the standard library.
"""

from __future__ import annotations

from typing import Any

import torch

from headlens.errors import ProbeError
from headlens.models.vocab import encode_body, token_strings, vocab
from headlens.probes.base import PYTHON_PAIRS, Probe, body_budget, bracket_annotations
from headlens.probes.prompt_file import read_prompts as read_prompts  # re-exported: its old home


# -- the user's texts ---------------------------------------------------------------------------
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
        body = _encode_bounded(model, text, room)
        if len(body) > room:
            if not truncate:
                size = len(body) + v.n_special_positions
                raise ProbeError(
                    f"prompt {i + 1} is {'' if len(text) <= (room + 2) * _CHARS_PER_TOKEN else 'over '}{size} "
                    f"tokens long; the model's context "
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


_CHARS_PER_TOKEN = 32  # more than nearly every token of a real vocabulary spans (whitespace runs included)


def _encode_bounded(model: Any, text: str, room: int) -> list[int]:
    """The body token ids of ``text``, or of a prefix of it when that prefix alone is longer than ``room``
    tokens: a 10 MB line is cut to fit or refused in a fraction of a second, not tokenized for minutes.
    Only a text whose prefix of ``(room + 2) * 32`` characters is ``room + 1`` tokens or fewer is
    tokenized whole (a prefix's tokens are the text's, but for the last one)."""
    cap = (room + 2) * _CHARS_PER_TOKEN
    if len(text) > cap:
        head = encode_body(model, text[:cap])
        if len(head) > room + 1:
            return head
    return encode_body(model, text)


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
    budget = body_budget(v, seq_len)
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
