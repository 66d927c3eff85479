"""Ordered lists whose items are single tokens of a model's vocabulary: the successor heads' probe.

Gould et al. (2023) find successor heads with ordinal sequences (numbers, number words, days, months,
letters) in the casings and spacings a tokenizer keeps whole. :func:`ordinal_lists` builds every variant
of the base lists (as written, lower case, title case; without and with a leading space) and keeps those
whose items are each exactly one distinct ordinary token of *this* model's tokenizer: a byte-level model
keeps the digits and the letters, a BPE model of English most of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from headlens.models.vocab import single_token, vocab

BASE_LISTS: dict[str, tuple[str, ...]] = {
    "digits": tuple("0123456789"),
    "numbers": ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"),
    "ordinals": ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth"),
    "days": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
    "months": ("January", "February", "March", "April", "May", "June", "July", "August", "September",
               "October", "November", "December"),
    "letters": tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
}
MIN_ITEMS = 3  # a list needs at least two successor steps


@dataclass(frozen=True)
class OrdinalList:
    """One ordered list in one spelling.

    Attributes:
        name: the base list and its spelling (``days``, ``days_lower``, ``days_sp`` for a leading space).
        items: the strings, in order.
        ids: ``(n,)`` long, each item's single token id.
    """

    name: str
    items: tuple[str, ...]
    ids: torch.Tensor


def _spellings(name: str, items: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    cases = {"": items, "_lower": tuple(s.lower() for s in items), "_title": tuple(s.title() for s in items)}
    out, seen = [], set()
    for case, words in cases.items():
        for space in ("", "_sp"):
            spelled = tuple((" " if space else "") + w for w in words)
            if spelled not in seen:
                seen.add(spelled)
                out.append((name + case + space, spelled))
    return out


def ordinal_lists(model: Any) -> list[OrdinalList]:
    """Every spelling of :data:`BASE_LISTS` whose items are each one distinct ordinary token of ``model``.

    >>> from headlens import GPT, ModelConfig
    >>> [o.name for o in ordinal_lists(GPT(ModelConfig(1, 1, 8, 16, 257)))]  # bytes: no leading-space tokens
    ['digits', 'letters', 'letters_lower']
    """
    if getattr(model, "tokenizer", None) is None:
        return []
    ordinary = set(vocab(model).ordinary)
    out = []
    for base, items in BASE_LISTS.items():
        for name, spelled in _spellings(base, items):
            flat = [i for s in spelled if (i := single_token(model, s)) is not None and i in ordinary]
            if len(flat) == len(spelled) >= MIN_ITEMS and len(set(flat)) == len(flat):
                out.append(OrdinalList(name, spelled, torch.tensor(flat, dtype=torch.long)))
    return out
