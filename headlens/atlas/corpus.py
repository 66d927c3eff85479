"""The text an atlas reads: the built-in prose and code corpora, or a user's ``.txt`` / JSONL file; and for a
model that reads neither (a zoo model over a few letters), ``repeats``: random tokens of its vocabulary with a
segment repeated (:func:`headlens.probes.generated.repeated_segments`).

The prose corpus is read as distinct lines (:func:`prose_windows`): windows never overlap, and a line that
differs from an earlier one only in its numbers (the standard library's generated codec modules share one
docstring) is read once, so no boilerplate line fills a head's exemplars.

Windows are split once into the pass's share and a held-out share (every ``heldout_every``-th window, at
most :data:`MAX_HELDOUT` of them spread evenly over the corpus), so a description's rule is scored on text
its exemplars never saw. The cap: scoring costs a forward per held-out window, and a few hundred windows
already pin every agreement's bootstrap interval to a few hundredths (benchmarks/README.md); the windows past it
go to the pass, where more text finds better exemplars.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from headlens.errors import ProbeError
from headlens.probes.base import Probe, body_budget

BUILT_IN = ("prose", "code", "repeats")
MAX_HELDOUT = 256  # held-out windows at most (module docstring)


def corpus_windows(model: Any, corpus: str, n_windows: int, seq_len: int, seed: int = 0) -> Probe:
    """``n_windows`` token windows of ``corpus`` (``"prose"``, ``"code"``, ``"repeats"`` or a path), specials included.

    >>> import headlens
    >>> len(corpus_windows(headlens.load("code"), "prose", 4, 32))
    4
    """
    from headlens.probes.generated import repeated_segments
    from headlens.probes.text import read_prompts, stdlib_windows, text_prompts

    if n_windows < 2:
        raise ProbeError(f"an atlas needs at least 2 windows of text (one held out); got n_windows={n_windows}")
    gen = torch.Generator().manual_seed(seed)
    if seq_len > int(model.cfg.n_ctx):  # said, not silently cut: the windows are shorter than asked
        import warnings

        warnings.warn(f"seq_len={seq_len} is beyond the model's context (n_ctx={model.cfg.n_ctx}): the atlas reads "
                      f"windows of {model.cfg.n_ctx} tokens", stacklevel=2)
        seq_len = int(model.cfg.n_ctx)
    if corpus == "prose":
        return prose_windows(model, n_windows, seq_len, gen)
    if corpus == "code":
        return stdlib_windows(model, n_windows, seq_len, gen)
    if corpus == "repeats":
        return repeated_segments(model, n_windows, seq_len, gen)
    if not Path(corpus).is_file():
        raise ProbeError(f"corpus {corpus!r} is neither a built-in corpus ({', '.join(BUILT_IN)}) nor a file")
    probe = text_prompts(model, read_prompts(corpus), truncate=True)
    probe.prompts = probe.prompts[:n_windows]
    if len(probe) < 2:
        raise ProbeError(f"corpus {corpus!r} gives {len(probe)} text; an atlas needs 2 or more (one held out)")
    return probe


def distinct_lines(text: str) -> list[str]:
    """The non-empty lines of ``text``, each once: a line equal to an earlier one once every word holding a digit
    is masked (``cp1252`` and ``cp437`` alike) is dropped.

    >>> distinct_lines("Codec cp437 from PC/CP437.TXT.\\nCodec cp850 from PC/CP850.TXT.\\n\\nOther.")
    ['Codec cp437 from PC/CP437.TXT.', 'Other.']
    """
    seen: set[str] = set()
    out = []
    for line in text.split("\n"):
        key = _DIGITS.sub("#", line.strip())
        if key and key not in seen:
            seen.add(key)
            out.append(line)
    return out


_DIGITS = re.compile(r"\S*\d\S*")


def prose_windows(model: Any, n_windows: int, seq_len: int, gen: torch.Generator) -> Probe:
    """``n_windows`` windows of the built-in prose (:func:`headlens.probes.prose.prose_corpus`) that share no line:
    each starts at a randomly drawn line and runs on over the next unread lines until it holds ``seq_len`` tokens
    (specials included); a start whose run meets a line already read, or the corpus' end, first is skipped."""
    from headlens.models.vocab import encode_body, vocab
    from headlens.probes.prose import prose_corpus

    v = vocab(model)
    budget = body_budget(v, seq_len)
    lines = distinct_lines(prose_corpus())
    used = [False] * len(lines)
    prompts = []
    for start in torch.randperm(len(lines), generator=gen).tolist():
        if len(prompts) == n_windows:
            break
        end, n = start, 0
        while n < budget and end < len(lines) and not used[end]:
            n += len(encode_body(model, lines[end])) + 1  # + 1: the newline
            end += 1
        try:
            body = encode_body(model, "\n".join(lines[start:end]))
            while len(body) < budget and end < len(lines) and not used[end]:  # lines tokenized alone ran long
                end += 1
                body = encode_body(model, "\n".join(lines[start:end]))
        except ProbeError as err:
            raise ProbeError(f"the prose corpus is English text, which this model cannot read: {err}") from None
        if len(body) < budget:
            continue
        body = body[:budget]
        used[start:end] = [True] * (end - start)
        prompts.append(torch.tensor(v.wrap(body), dtype=torch.long))
    return Probe("prose", prompts, {}, settings={
        "seq_len": seq_len, "source": "distinct lines of English prose of the Python standard library's "
        "documentation, no line in two windows", "n_lines": len(lines)})


def split(windows: list[torch.Tensor], heldout_every: int = 4, max_heldout: int = MAX_HELDOUT
          ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The pass's windows and the held-out ones (:func:`heldout_rows`)."""
    held = set(heldout_rows(len(windows), heldout_every, max_heldout))
    return [w for i, w in enumerate(windows) if i not in held], [windows[i] for i in sorted(held)]


def heldout_rows(n: int, heldout_every: int = 4, max_heldout: int = MAX_HELDOUT) -> list[int]:
    """Which of ``n`` windows are held out: every ``heldout_every``-th (the last when that gives none); past
    ``max_heldout`` of those, ``max_heldout`` spread evenly (the last of each ``n / max_heldout`` windows).

    >>> heldout_rows(10), heldout_rows(2), heldout_rows(100, max_heldout=5)
    ([3, 7], [1], [19, 39, 59, 79, 99])
    """
    if n // heldout_every > max_heldout:
        return [(j + 1) * n // max_heldout - 1 for j in range(max_heldout)]
    return [i for i in range(n) if i % heldout_every == heldout_every - 1] or [n - 1]
