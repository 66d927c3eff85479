"""Annotated prompts: head types defined by data, with character spans mapped to tokens.

A row of ``--prompts FILE.jsonl`` (or a dict passed to ``headlens.classify(prompts=[...])``)
may carry its own targets::

    {"text": "John told Mary that she was late.",
     "targets": [{"query": [20, 23], "keys": [[10, 14]]}],
     "distractors": [[0, 4]],
     "detector": "coreference"}

Spans are ``[start, end)`` character offsets into ``text``. Each target says "from the query
span, attention should go to the key spans"; ``distractors`` (on the row, for all its
targets, or on one target) are the competing candidates of Clark et al. 2019's preference
accuracy. ``detector`` names the head type (default ``"annotated"``).

Why it looks like this:

* **Spans, not token ids.** Character spans survive any tokenizer: byte and char level (the
  native :class:`headlens.models.tokenizer.Tokenizer`), WordPiece and BPE (any *fast* Hugging Face
  tokenizer, through its offsets mapping). A span takes every token it overlaps; when its
  ends do not fall on token boundaries (whitespace that a BPE token carries does not count),
  the provenance lists it as ``unaligned``: the head is then scored on a superset of the span.
* **Targets as token lists.** A :class:`Target` holds the query positions and, per key and
  distractor span, its positions: a per-row list of key indices, the shape the scan's
  sparse ``(B, Q, M)`` targets take too.
* **Every bad annotation is one line** (``ProbeError``, CLI exit 5) naming the row, the
  target and the bad value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from headlens.errors import ProbeError
from headlens.models.vocab import vocab

DEFAULT_NAME = "annotated"
ROW_FIELDS = ("text", "targets", "distractors", "detector")
TARGET_FIELDS = ("query", "keys", "distractors")

Span = tuple[int, int]


@dataclass(frozen=True)
class Target:
    """One annotated target, in token positions of the full prompt (specials included).

    Attributes:
        query: positions of the query span (their rows are averaged, see ``headlens.scoring.annotated``).
        keys: positions of every key span together (the mass on them is summed).
        distractors: one tuple of positions per distractor span (competing candidates).
    """

    query: tuple[int, ...]
    keys: tuple[int, ...]
    distractors: tuple[tuple[int, ...], ...] = ()


@dataclass
class AnnotatedProbe:
    """Prompts of one annotated head type with their targets.

    Attributes:
        name: the head type (``detector`` column of the scores table).
        prompts: 1-D long tensors (specials included).
        targets: one list of :class:`Target` per prompt.
        texts: the texts the prompts came from.
        settings: provenance: prompts, targets, unaligned spans.
    """

    name: str
    prompts: list[torch.Tensor]
    targets: list[list[Target]]
    texts: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.prompts)


def read_rows(path: str | Path) -> list[str | dict[str, Any]]:
    """The rows of a prompts file: strings (plain lines, or JSONL without targets) and dicts (with them)."""
    from headlens.probes.text import read_prompts

    p = Path(path)
    texts = read_prompts(p)  # every check on the file itself (exists, UTF-8, JSON, "text")
    lines = [ln for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not all(ln.lstrip().startswith("{") for ln in lines):
        return list(texts)
    rows: list[str | dict[str, Any]] = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            obj = json.loads(line)
            obj = dict(obj, _where=f"{str(path)!r} line {n}")
            rows.append(obj if set(obj) - {"text", "_where"} else obj["text"])
    return rows


def is_annotated(row: Any) -> bool:
    return isinstance(row, dict) and any(k in row for k in ("targets", "distractors", "detector"))


def _where(row: dict[str, Any], i: int) -> str:
    return str(row.get("_where", f"prompt {i + 1}"))


def _span(value: Any, n_chars: int, what: str) -> Span:
    ok = (isinstance(value, list | tuple) and len(value) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) for v in value))
    if not ok:
        raise ProbeError(f"{what} is {value!r}; expected [start, end] character offsets")
    s, e = int(value[0]), int(value[1])
    if not 0 <= s < e <= n_chars:
        raise ProbeError(f"{what} {[s, e]} is out of range: expected 0 <= start < end <= {n_chars} "
                         f"(the text's length in characters)")
    return s, e


def _spans(value: Any, n_chars: int, what: str, allow_empty: bool) -> list[Span]:
    if not isinstance(value, list | tuple):
        raise ProbeError(f"{what} is {value!r}; expected a list of [start, end] spans")
    if not value and not allow_empty:
        raise ProbeError(f"{what} is empty; expected at least one [start, end] span")
    return [_span(v, n_chars, f"{what} span {j + 1}") for j, v in enumerate(value)]


def check_row(row: dict[str, Any], i: int) -> tuple[str, str, list[tuple[Span, list[Span], list[Span]]]]:
    """``(text, detector name, [(query, keys, distractors), ...])`` of one annotated row, or a ProbeError."""
    where = _where(row, i)
    unknown = sorted(set(row) - set(ROW_FIELDS) - {"_where"})
    if unknown:
        raise ProbeError(f"{where}: unknown field(s) {unknown}; an annotated row has {', '.join(ROW_FIELDS)}")
    text = row.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ProbeError(f'{where}: expected a non-empty string "text" field')
    name = row.get("detector", DEFAULT_NAME)
    if not isinstance(name, str) or not name.strip() or "," in name:
        raise ProbeError(f'{where}: "detector" is {name!r}; expected a name without commas')
    targets = row.get("targets")
    if not isinstance(targets, list) or not targets:
        raise ProbeError(f'{where}: "targets" is {targets!r}; expected a non-empty list of '
                         f'{{"query": [start, end], "keys": [[start, end], ...]}}')
    shared = _spans(row.get("distractors", []), len(text), f"{where}: distractors", allow_empty=True)
    out = []
    for j, t in enumerate(targets):
        what = f"{where}: target {j + 1}"
        if not isinstance(t, dict):
            raise ProbeError(f'{what} is {t!r}; expected {{"query": [start, end], "keys": [[start, end], ...]}}')
        bad = sorted(set(t) - set(TARGET_FIELDS))
        if bad:
            raise ProbeError(f"{what}: unknown field(s) {bad}; a target has {', '.join(TARGET_FIELDS)}")
        if "query" not in t or "keys" not in t:
            raise ProbeError(f'{what}: needs both "query" and "keys"')
        query = _span(t["query"], len(text), f"{what} query")
        keys = _spans(t["keys"], len(text), f"{what} keys", allow_empty=False)
        own = _spans(t.get("distractors", []), len(text), f"{what} distractors", allow_empty=True)
        out.append((query, keys, shared + own))
    return text, name.strip(), out


# -- spans to tokens ------------------------------------------------------------------------------
def body_offsets(model: Any, text: str) -> tuple[list[int], list[Span]]:
    """Token ids of ``text`` (no specials) and each token's ``[start, end)`` character offsets.

    >>> from headlens.models.tokenizer import Tokenizer
    >>> from types import SimpleNamespace
    >>> body_offsets(SimpleNamespace(tokenizer=Tokenizer.byte_level()), "hé!")
    ([104, 195, 169, 33], [(0, 1), (1, 2), (1, 2), (2, 3)])
    """
    tok = model.tokenizer
    kind = getattr(tok, "kind", None)
    if kind in ("byte", "char"):  # native tokenizer: one token per byte or per character
        ids = tok.encode(text)
        if kind == "char":
            return ids, [(c, c + 1) for c in range(len(text))]
        offsets = [(c, c + 1) for c, ch in enumerate(text) for _ in ch.encode("utf-8")]
        return ids, offsets
    if not getattr(tok, "is_fast", False):
        raise ProbeError(f"the tokenizer of {getattr(model, 'name', 'this model')!r} ({type(tok).__name__}) "
                         f"gives no character offsets; annotated prompts need a fast Hugging Face tokenizer")
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [(int(s), int(e)) for s, e in enc["offset_mapping"]]


def _core(text: str, s: int, e: int) -> Span:
    """A token's offsets without the whitespace BPE tokens carry (``" Mary"`` -> ``"Mary"``)."""
    piece = text[s:e]
    lead = len(piece) - len(piece.lstrip())
    trail = len(piece) - len(piece.rstrip())
    return (s + lead, e - trail) if lead + trail < len(piece) else (s, e)


def span_tokens(text: str, offsets: list[Span], span: Span) -> tuple[list[int], bool]:
    """Body token indices that overlap ``span``, and whether the span's ends fall on token boundaries.

    >>> span_tokens("John told", [(0, 4), (5, 9)], (5, 9))
    ([1], True)
    >>> span_tokens("John told", [(0, 4), (5, 9)], (2, 7))
    ([0, 1], False)
    """
    s, e = span
    hit = [i for i, (a, b) in enumerate(offsets) if a < e and b > s and b > a]
    if not hit:
        return [], False
    aligned = _core(text, *offsets[hit[0]])[0] >= s and _core(text, *offsets[hit[-1]])[1] <= e
    return hit, aligned


def _positions(text: str, offsets: list[Span], span: Span, what: str, truncate: bool,
               unaligned: list[dict[str, Any]]) -> list[int] | None:
    """Body token indices of ``span``; None when ``--truncate`` cut it off; unaligned spans are recorded."""
    hit, aligned = span_tokens(text, offsets, span)
    if not hit:
        if span[1] <= (offsets[-1][1] if offsets else 0) or not truncate:
            raise ProbeError(f"{what} {list(span)} ({text[span[0]:span[1]]!r}) covers no token")
        return None
    if not aligned:
        unaligned.append({"where": what, "span": list(span), "text": text[span[0]:span[1]],
                          "tokens": [text[a:b] for a, b in (offsets[h] for h in hit)]})
    return hit


def _map_row(model: Any, row: dict[str, Any], i: int, offsets: list[Span], shift: int, truncate: bool,
             unaligned: list[dict[str, Any]]) -> list[Target]:
    """The targets of one checked row in prompt positions (body index + ``shift`` specials)."""
    text, _, specs = check_row(row, i)
    targets = []
    for j, (q, keys, dis) in enumerate(specs):
        what = f"{_where(row, i)}: target {j + 1}"
        qp = _positions(text, offsets, q, f"{what} query", truncate, unaligned)
        kp = [_positions(text, offsets, k, f"{what} key", truncate, unaligned) for k in keys]
        dp = [_positions(text, offsets, d, f"{what} distractor", truncate, unaligned) for d in dis]
        if qp is None or any(p is None for p in kp):
            continue  # cut off by --truncate
        query = tuple(p + shift for p in qp)
        key_pos = tuple(sorted({p + shift for k in kp for p in k}))
        if model.is_causal and min(key_pos) > max(query):
            raise ProbeError(f"{what}: every key lies after the query; {getattr(model, 'name', 'this model')!r} "
                             f"is causal, so no query row can attend to them")
        targets.append(Target(query, key_pos, tuple(tuple(p + shift for p in d) for d in dp if d is not None)))
    return targets


def annotated_probe(model: Any, rows: list[tuple[int, dict[str, Any]]], name: str,
                    truncate: bool = False) -> AnnotatedProbe:
    """Tokenize annotated ``(index, row)`` pairs of one head type through ``model``'s tokenizer.

    A span that covers no token (only whitespace between tokens) is a ``ProbeError``; in a causal
    model a target whose keys all lie after its query is one too (no row could attend to them).
    A text longer than the context is refused unless ``truncate`` (targets cut off are dropped).
    """
    v = vocab(model)
    room = int(model.cfg.n_ctx) - v.n_special_positions
    prompts, all_targets, texts, unaligned, n_cut = [], [], [], [], 0
    for i, row in rows:
        text = check_row(row, i)[0]
        ids, offsets = body_offsets(model, text)
        if len(ids) > room and not truncate:
            raise ProbeError(f"{_where(row, i)} is {len(ids) + v.n_special_positions} tokens long; the model's "
                             f"context is n_ctx={model.cfg.n_ctx}; shorten it or pass --truncate")
        n_cut += len(ids) > room
        ids, offsets = ids[:room], offsets[:room]
        all_targets.append(_map_row(model, row, i, offsets, len(v.prefix), truncate, unaligned))
        prompts.append(torch.tensor(v.wrap(ids), dtype=torch.long))
        texts.append(text)
    settings = {"n_texts": len(texts), "n_targets": sum(len(t) for t in all_targets),
                "n_with_distractors": sum(bool(t.distractors) for ts in all_targets for t in ts),
                "unaligned_spans": unaligned, "n_truncated": n_cut,
                "query_rows": "mean over the query span's tokens; key mass summed over the key tokens"}
    return AnnotatedProbe(name, prompts, all_targets, texts, settings)


def split_rows(rows: list[Any]) -> tuple[list[str], dict[str, list[tuple[int, dict[str, Any]]]]]:
    """All texts (for the built-in detectors), and the annotated rows grouped by head type.

    Raises ``ProbeError`` for a row that is neither a string nor a dict with a ``"text"``.
    """
    texts: list[str] = []
    groups: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for i, row in enumerate(rows):
        if isinstance(row, str):
            texts.append(row)
            continue
        if not isinstance(row, dict):
            raise ProbeError(f"prompt {i + 1} is {type(row).__name__}; expected a string or a dict with a 'text'")
        if not is_annotated(row):
            unknown = sorted(set(row) - {"text", "_where"})
            if unknown:
                raise ProbeError(f"{_where(row, i)}: unknown field(s) {unknown}; an annotated row has "
                                 f"{', '.join(ROW_FIELDS)}")
            if not isinstance(row.get("text"), str):
                raise ProbeError(f'{_where(row, i)}: expected a string "text" field')
            texts.append(row["text"])
            continue
        text, name, _ = check_row(row, i)
        texts.append(text)
        groups.setdefault(name, []).append((i, row))
    return texts, groups
