"""Named positions by character span: a prompts file says where IO, S2 or END are, for circuits at positions.

A row of ``--prompts FILE.jsonl`` (or a dict passed to ``headlens.circuit(prompts=[...])``) may name
positions of its text::

    {"text": "When Mary and John went to the store, John gave a drink to",
     "positions": {"IO": [5, 9], "S1": [14, 18], "S2": [38, 42], "END": [56, 58]}}

Each span is ``[start, end)`` character offsets into ``text``; the position it names is the **last** token
the span overlaps (a causal model has read the whole span there; ``" Mary"``'s leading space belongs to
its token). Names are the probe's own (``Probe.positions``); ``all`` is reserved for every position. A row
that does not name a position has ``-1`` there: edges at that position leave it out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from headlens.errors import ProbeError

RESERVED = "all"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_+\-]*$")


def _where(row: dict[str, Any], i: int) -> str:
    return str(row.get("_where", f"prompt {i + 1}"))


def row_spans(row: Any, i: int) -> tuple[str, dict[str, tuple[int, int]]]:
    """``(text, {name: (start, end)})`` of one row (a string names nothing), or a one-line ``ProbeError``."""
    if isinstance(row, str):
        return row, {}
    if not isinstance(row, dict) or not isinstance(row.get("text"), str) or not row["text"].strip():
        raise ProbeError(f'{_where(row, i) if isinstance(row, dict) else f"prompt {i + 1}"}: expected a string '
                         f'or a row with a non-empty string "text"')
    where, text = _where(row, i), row["text"]
    unknown = sorted(set(row) - {"text", "positions", "_where"})
    if unknown:
        raise ProbeError(f'{where}: unknown field(s) {unknown}; a row for circuits has "text" and "positions"')
    spans = row.get("positions", {})
    if not isinstance(spans, dict):
        raise ProbeError(f'{where}: "positions" is {spans!r}; expected {{"END": [start, end], ...}}')
    out = {}
    for name, span in spans.items():
        if not isinstance(name, str) or not _NAME.match(name) or name == RESERVED:
            raise ProbeError(f"{where}: position name {name!r} is not allowed; expected letters, digits, _ + - "
                             f"(and not {RESERVED!r}, which means every position)")
        ok = (isinstance(span, list | tuple) and len(span) == 2
              and all(isinstance(v, int) and not isinstance(v, bool) for v in span))
        if not ok or not 0 <= span[0] < span[1] <= len(text):
            raise ProbeError(f"{where}: position {name} is {span!r}; expected [start, end] character offsets "
                             f"with 0 <= start < end <= {len(text)}")
        out[name] = (int(span[0]), int(span[1]))
    return text, out


def named_positions(model: Any, rows: Sequence[Any], shift: int | None = None) -> tuple[list[str], dict[str, torch.Tensor]]:
    """The rows' texts, and each named position as an ``(N,)`` token index of the full prompt (``shift``: the
    special tokens before the text, default the model's own: BOS).

    >>> from types import SimpleNamespace as NS
    >>> from headlens.models.tokenizer import Tokenizer
    >>> m = NS(tokenizer=Tokenizer.byte_level(), is_causal=True, name="bytes")
    >>> named_positions(m, [{"text": "ab cd", "positions": {"X": [3, 5]}}, "ef"], shift=1)[1]["X"].tolist()
    [5, -1]
    """
    from headlens.probes.spans import body_offsets, span_tokens

    if shift is None:
        from headlens.models.vocab import vocab

        shift = len(vocab(model).prefix)
    texts, found = [], []
    for i, row in enumerate(rows):
        text, spans = row_spans(row, i)
        texts.append(text)
        if not spans:
            found.append({})
            continue
        _, offsets = body_offsets(model, text)
        pos = {}
        for name, span in spans.items():
            hit, _ = span_tokens(text, offsets, span)
            if not hit:
                raise ProbeError(f"{_where(row, i)}: position {name} {list(span)} ({text[span[0]:span[1]]!r}) "
                                 f"covers no token")
            pos[name] = hit[-1] + shift
        found.append(pos)
    names = list(dict.fromkeys(n for f in found for n in f))
    index = {n: torch.tensor([f.get(n, -1) for f in found], dtype=torch.long) for n in names}
    return texts, index
