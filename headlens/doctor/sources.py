"""What the doctor measures losses on: how much text for a model of this size, English prose or Python
source, and periodic random segments that any copying model predicts.

Why it looks like this:

* **Sized to the model.** Every head layout the weight shapes allow is run on every source, so the cost is
  (layouts) x (sources) x (tokens) forward passes of the whole model. 48 rows of 512 tokens suit a model
  of d_model 64 (milliseconds); on a 135M-parameter LM the same took over 20 minutes on 2 cores. So,
  unless the caller fixes them, rows and row length shrink as the parameter count grows
  (:func:`evaluation_size`): a wrong split of a trained LM costs nats per token, which 8 rows of 64 tokens
  resolve (the sequential rule of :mod:`headlens.doctor.racing` stops there when they do).
* **A real LM reads English.** A tokenizer that splits text into words or word pieces (more than
  1.5 characters per token) gets English prose (:func:`headlens.probes.prose.prose_corpus`), a byte- or
  character-level one Python source (the zoo's and the doctor's own byte models were trained on it).
  Either is checked for fit before it counts (:func:`headlens.doctor.verdict.text_fit`).
* **Copying evidence that is not ambiguous.** A periodic row ``BOS s s s ...`` repeats one segment
  ``s`` of distinct token ids (drawn without replacement, so never longer than the vocabulary): every
  token after the first period has exactly one earlier occurrence to copy from. Segments longer than a
  small vocabulary (255 tokens over 64 ids) made tokens recur inside a segment, so copying was ambiguous
  and even the true layout predicted them worse than their frequencies. Several periods
  (:func:`periods`), each its own source: a model that learnt to copy at one distance only (the word
  Llama of the tests copies 31 back) still gives evidence, and one that copies at none gives none.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

TOKEN_BUDGET = 1.4e11  # parameters x tokens per layout and source: ~1,000 tokens for a 135M-parameter model
MIN_ROWS, MIN_SEQ_LEN = 16, 64  # the smallest sized evaluation: two looks of 8 rows (racing.MIN_LOOK)
DEFAULT_ROWS, DEFAULT_SEQ_LEN = 48, 512  # small models: as many rows and tokens as the context allows
WORDS_PER_TOKEN = 1.5  # characters per token above which a tokenizer reads words (prose), not bytes


@dataclass(frozen=True)
class EvalSource:
    """Rows of token ids ``[(N_i, T_i)]`` (BOS first when the model has one) and what they are."""

    name: str  # "text" | "random tokens (period P)"
    rows: list[torch.Tensor]
    description: str
    chance: float | None = None  # generated ids: log of the pool they are drawn from (what copying must beat)


def evaluation_size(n_params: int, n_ctx: int, n_rows: int | None = None, seq_len: int | None = None
                    ) -> tuple[int, int]:
    """``(rows, tokens per row)`` of each source: the caller's, else sized to ``n_params`` (see the module
    docstring); the row length never exceeds the context.

    >>> evaluation_size(100_000, 64), evaluation_size(135_000_000, 8192), evaluation_size(10**9, 2048, seq_len=256)
    ((48, 64), (16, 64), (16, 256))
    """
    tokens = max(MIN_ROWS * MIN_SEQ_LEN, min(DEFAULT_ROWS * DEFAULT_SEQ_LEN, int(TOKEN_BUDGET / max(1, n_params))))
    sized = max(MIN_SEQ_LEN, min(DEFAULT_SEQ_LEN, tokens // MIN_ROWS // 16 * 16))  # a multiple of 16 tokens
    T = min(n_ctx, seq_len if seq_len is not None else sized)
    rows = n_rows if n_rows is not None else max(MIN_ROWS, min(DEFAULT_ROWS, tokens // T))
    return rows, T


def stdlib_text(n_chars: int, seed: int) -> str:
    """About ``n_chars`` of Python standard-library source, from files drawn with ``seed``."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.stat().st_size > 4000)
    gen = torch.Generator().manual_seed(seed)
    text = ""
    for i in torch.randperm(len(files), generator=gen).tolist():
        text += files[i].read_text(encoding="utf-8", errors="replace")[1000:3000]
        if len(text) >= n_chars:
            break
    return text


def reads_words(encode: Callable[[str], list[int]]) -> bool:
    """Whether a tokenizer reads words or word pieces (prose fits it) rather than bytes or characters."""
    from headlens.probes.prose import prose_corpus

    sample = prose_corpus()[:4000]
    return len(sample) / max(1, len(encode(sample))) > WORDS_PER_TOKEN


def prose_rows(encode: Callable[[str], list[int]], n_rows: int, T: int, first: int | None, seed: int
               ) -> torch.Tensor | None:
    """``(n, T)`` rows of English prose, each ``first`` (BOS; none when None) then tokens from a paragraph
    drawn with ``seed`` onwards; None when the corpus is too short for one row."""
    from headlens.probes.prose import prose_corpus

    text = prose_corpus()
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    span = 8 * T  # characters: enough for T tokens of a word-piece tokenizer (~4 characters each)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    body = T - (first is not None)
    for i in torch.randperm(len(starts), generator=gen).tolist():
        ids = encode(text[starts[i]:starts[i] + span])[:body]
        if len(ids) == body:
            rows.append(ids if first is None else [first, *ids])
        if len(rows) == n_rows:
            break
    return torch.tensor(rows) if rows else None


def periods(n_ids: int, body: int) -> list[int]:
    """The segment lengths of the periodic sources: the longest that repeats at least once in ``body``
    tokens without exceeding the ``n_ids`` ids, and its half and quarter (at least 2).

    >>> periods(64, 63), periods(49_000, 63), periods(16, 511), periods(3, 10)
    ([31, 15, 7], [31, 15, 7], [16, 8, 4], [3, 2])
    """
    hi = min(n_ids, body // 2)
    return sorted({max(2, p) for p in (hi, hi // 2, hi // 4)} & set(range(2, hi + 1)), reverse=True) or [max(1, hi)]


def periodic_rows(ids: torch.Tensor, n_rows: int, T: int, period: int, bos: int | None, seed: int
                  ) -> torch.Tensor:
    """``(n_rows, T)`` rows ``[BOS] s s s ...``: each a segment of ``period`` distinct ids from ``ids``
    (without replacement), repeated to fill the row.

    >>> row = periodic_rows(torch.arange(2, 10), n_rows=1, T=8, period=3, bos=1, seed=0)[0]
    >>> int(row[0]), len(set(row[1:4].tolist())), row[4:7].tolist() == row[1:4].tolist()
    (1, 3, True)
    """
    gen = torch.Generator().manual_seed(seed * 1009 + period)
    body = T - (bos is not None)
    segs = torch.stack([ids[torch.randperm(len(ids), generator=gen)[:period]] for _ in range(n_rows)])  # (N, P)
    tokens = segs.repeat(1, -(-body // period))[:, :body]  # (N, body): s s s ... cut at the row's end
    if bos is None:
        return tokens
    return torch.cat([torch.full((n_rows, 1), int(bos)), tokens], dim=1)  # (N, T)


def periodic_sources(ids: torch.Tensor, n_rows: int, T: int, bos: int | None, seed: int) -> list[EvalSource]:
    """One periodic source per period of :func:`periods` over the ordinary ids ``ids``."""
    body = T - (bos is not None)
    out = []
    for p in periods(len(ids), body):
        rows = periodic_rows(ids, n_rows, T, p, bos, seed)
        out.append(EvalSource(f"random tokens (period {p})", [rows],
                              f"random segments of {p} distinct ids of {len(ids)}, repeated "
                              f"({n_rows} x {rows.shape[1]} tokens)", math.log(len(ids))))
    return out
