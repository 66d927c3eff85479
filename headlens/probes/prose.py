"""English prose every machine has: the standard library's documentation, as text a language model reads.

Why it looks like this:

* **Where the prose comes from.** Python ships its reference documentation as plain text
  (``pydoc_data.topics``, ~460 KB: the language reference's sections as ``help()`` shows them) and
  its modules' docstrings. Both are read without importing any module: ``pydoc_data`` is data, and
  docstrings are the triple-quoted strings that start a line of each ``.py`` file.
* **Prose, not code.** A paragraph is kept when it reads as sentences: at least eight words, no
  doctest (``>>>``) or indented code lines, mostly letters and ordinary punctuation, and ending like a
  sentence. Line wraps inside a paragraph become spaces, so the text flows as a real document would.
  The code corpus (``--corpus stdlib``: held-out source files) is separate; a real LM reads this one
  (``--corpus prose``) the way it read the web.
* **Deterministic.** Paragraphs are ordered by source (topics, then modules by path) and the stream
  is fixed for a Python version; windows are drawn from it with the caller's generator.
"""

from __future__ import annotations

import inspect
import re
import sysconfig
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from headlens.errors import ProbeError
from headlens.models.vocab import encode_body, vocab
from headlens.probes.base import Probe, body_budget

MIN_WORDS = 8
_CODE_LINE = re.compile(r"^\s*(>>>|\.\.\.|\$ |[#%]|[A-Za-z_][\w.]*\(.*\)\s*$)")
_MARKUP = re.compile(r":(?:\w+:)+`([^`]*)`|``([^`]*)``|\*\*([^*]*)\*\*")  # reST roles, literals, bold


def _clean(paragraph: str) -> str | None:
    """The paragraph as one line of prose, or None when it is not prose (code, tables, lists of names)."""
    lines = [ln for ln in paragraph.splitlines() if ln.strip()]
    if not lines or any(_CODE_LINE.match(ln) for ln in lines):
        return None
    indent = min(len(ln) - len(ln.lstrip()) for ln in lines)
    if any(len(ln) - len(ln.lstrip()) > indent + 2 for ln in lines[1:]):
        return None  # an indented block inside: code or a definition list
    text = " ".join(ln.strip() for ln in lines)
    text = _MARKUP.sub(lambda m: next(g for g in m.groups() if g is not None), text)
    words = text.split()
    if len(words) < MIN_WORDS or text[-1] not in ".:?!)\"'":
        return None
    letters = sum(c.isalpha() or c in " ,.;:'\"()-?!" for c in text)
    if letters < 0.9 * len(text) or sum(w[0].isupper() for w in words) > 0.5 * len(words):
        return None
    return text


def paragraphs(text: str) -> list[str]:
    """The prose paragraphs of ``text`` (blank-line separated), each cleaned to one line.

    >>> paragraphs("Return the sum of the two numbers, or raise an error when they differ.\\n\\n>>> add(1, 2)\\n3")
    ['Return the sum of the two numbers, or raise an error when they differ.']
    """
    return [p for block in re.split(r"\n\s*\n", text) if (p := _clean(block)) is not None]


_DOCSTRING = re.compile(r'^[ \t]*[rRuU]?("""|\'\'\')(.*?)\1', re.S | re.M)  # a string that starts a line


def _docstrings(path: Path) -> list[str]:
    """The triple-quoted strings that start a line of ``path`` (docstrings, and a few others the prose
    filter drops), dedented. A regular expression, not :mod:`ast`: 0.7 s for the whole library, not 7."""
    text = path.read_text(encoding="utf-8", errors="replace")
    return [inspect.cleandoc(m.group(2)) for m in _DOCSTRING.finditer(text)]


@lru_cache(maxsize=1)
def prose_corpus() -> str:
    """Every prose paragraph of the standard library's documentation, one paragraph per line."""
    out: list[str] = []
    try:
        from pydoc_data.topics import topics  # plain data: the reference's sections as text
    except ImportError:  # a stripped Python without pydoc_data
        topics = {}
    for key in sorted(topics):
        out += paragraphs(topics[key])
    root = Path(sysconfig.get_paths()["stdlib"])
    for f in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        if {"site-packages", "dist-packages", "test", "tests", "idlelib"} & set(f.parts):
            continue
        for doc in _docstrings(f):
            out += paragraphs(doc)
    seen: set[str] = set()
    unique = [p for p in out if not (p in seen or seen.add(p))]  # inherited docstrings repeat
    if not unique:
        raise ProbeError("no English prose found in this Python's standard library (pydoc_data, docstrings)")
    return "\n".join(unique)


def prose_windows(model: Any, n_prompts: int, seq_len: int, gen: torch.Generator) -> Probe:
    """``n_prompts`` windows of English prose, each starting at a paragraph and ``seq_len`` tokens long
    (specials included), tokenized by the model; a window runs on across paragraphs (newline-separated)."""
    v = vocab(model)
    budget = body_budget(v, seq_len)
    text = prose_corpus()
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    span = 12 * budget  # characters enough for ``budget`` tokens under any tokenizer
    picks = torch.randint(0, max(1, len(starts) - 1), (n_prompts,), generator=gen).tolist()
    prompts = []
    for i in picks:
        start = min(starts[i], max(0, len(text) - span))
        try:
            body = encode_body(model, text[start:start + span])[:budget]
        except ProbeError as err:
            raise ProbeError(f"the prose corpus is English text, which this model cannot read: {err}") from None
        prompts.append(torch.tensor(v.wrap(body), dtype=torch.long))
    return Probe("prose", prompts, {}, settings={
        "seq_len": seq_len, "source": "English prose of the Python standard library's documentation "
        "(pydoc_data topics and docstrings)", "n_chars": len(text),
        "why_short": f"the prose corpus is {len(text)} characters"})
