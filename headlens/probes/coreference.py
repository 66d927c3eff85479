"""Coreference probe: templated sentences whose pronoun only one of two candidates can be.

Two kinds of sentence, drawn half and half:

* **gender**: ``"Yesterday, John told Mary that she needed help."``: a male and a female name,
  a pronoun (``he``/``she``) that matches one of them;
* **number**: ``"Later, we put the keys beside the lamp because they were dirty."``: a plural
  and a singular noun, ``they``/``it``.

The referent is the first or the second candidate at random (a fair coin per sentence), so a
head that attends to a fixed candidate position scores about half, not 1. Each sentence is an
annotated prompt (:mod:`headlens.probes.spans`): query = the pronoun, key = the referent,
distractor = the other candidate; the ``coreference`` detector scores heads on them, with the
preference accuracy of Clark et al. 2019 (how often the referent gets more attention than the
other candidate).

Every name, noun and pronoun must be one token of the model's tokenizer (MiniLM's WordPiece
and GPT-2's BPE keep them; byte and char tokenizers split them): words a tokenizer splits are
left out, and a tokenizer that keeps too few is refused with one line saying so
(:func:`unsupported`). Each example also carries the two resolved paraphrases
(``"Mary needed help."`` / ``"John needed help."``) for the causal check in
:mod:`headlens.interventions.metrics`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from headlens.errors import ProbeError
from headlens.probes.spans import body_offsets, span_tokens

LEADS = ("Yesterday", "Today", "Later", "Last week", "That morning", "In the end")
MALE = ("John", "James", "David", "Michael", "Robert", "William", "Thomas", "Peter", "Paul", "George",
        "Henry", "Jack", "Frank", "Mark", "Steven", "Kevin")
FEMALE = ("Mary", "Sarah", "Anna", "Emma", "Linda", "Susan", "Lisa", "Karen", "Julia", "Alice", "Laura",
          "Helen", "Kate", "Jane", "Rachel", "Emily")
GENDER_FRAMES = ("{A} told {B} that {P} {V}.", "{A} called {B} because {P} {V}.",
                 "{A} wrote to {B} since {P} {V}.", "{A} smiled at {B} although {P} {V}.",
                 "{A} met {B} when {P} {V}.", "{A} waved to {B} as {P} {V}.")
GENDER_PREDICATES = ("needed help", "was tired", "had won the race", "was late", "felt sick", "was angry",
                     "lost the keys", "looked happy")
SINGULAR = ("box", "lamp", "chair", "table", "bottle", "bag", "phone", "clock", "desk", "bowl")
PLURAL = ("keys", "coins", "plates", "shoes", "cups", "pens", "books", "tools", "papers", "glasses")
NUMBER_FRAMES = ("we put the {A} beside the {B} because {P} {V}.", "we found the {A} under the {B}, and {P} {V}.",
                 "I moved the {A} next to the {B} since {P} {V}.", "you left the {A} near the {B} because {P} {V}.")
NUMBER_PREDICATES = (("was broken", "were broken"), ("was dirty", "were dirty"), ("was heavy", "were heavy"),
                     ("was missing", "were missing"), ("looked old", "looked old"), ("was wet", "were wet"))
PRONOUNS = {"male": "he", "female": "she", "singular": "it", "plural": "they"}
MIN_WORDS = 4  # single-token names (or nouns) of each class a kind needs


@dataclass(frozen=True)
class Example:
    """One coreference sentence.

    Attributes:
        text: the sentence.
        kind: ``"gender"`` or ``"number"``.
        pronoun, referent, other: ``[start, end)`` character spans.
        referent_first: whether the referent is the first candidate.
        resolved: the predicate with the referent as subject (``"Mary needed help."``).
        wrong: the same with the other candidate (``"John needed help."``).
    """

    text: str
    kind: str
    pronoun: tuple[int, int]
    referent: tuple[int, int]
    other: tuple[int, int]
    referent_first: bool
    resolved: str
    wrong: str

    def row(self) -> dict[str, Any]:
        """The annotated prompt row (``headlens.probes.spans``) of this sentence."""
        return {"text": self.text, "detector": "coreference",
                "targets": [{"query": list(self.pronoun), "keys": [list(self.referent)]}],
                "distractors": [list(self.other)]}


def _is_one_token(model: Any, word: str) -> bool:
    text = f"Then {word} left."
    try:
        _, offsets = body_offsets(model, text)
    except ProbeError:
        return False
    hit, aligned = span_tokens(text, offsets, (5, 5 + len(word)))
    return len(hit) == 1 and aligned


def usable_words(model: Any) -> dict[str, list[str]]:
    """The words of each class that ``model``'s tokenizer keeps as one token."""
    classes = {"male": MALE, "female": FEMALE, "singular": SINGULAR, "plural": PLURAL}
    out = {c: [w for w in words if _is_one_token(model, w)] for c, words in classes.items()}
    out["pronouns"] = [p for p in PRONOUNS.values() if _is_one_token(model, p)]
    return out


def kinds(model: Any) -> list[str]:
    """The sentence kinds ``model``'s tokenizer supports (``gender``, ``number``)."""
    w = usable_words(model)
    ok = []
    if min(len(w["male"]), len(w["female"])) >= MIN_WORDS and {"he", "she"} <= set(w["pronouns"]):
        ok.append("gender")
    if min(len(w["singular"]), len(w["plural"])) >= MIN_WORDS and {"it", "they"} <= set(w["pronouns"]):
        ok.append("number")
    return ok


def unsupported(model: Any) -> str | None:
    """Why ``model`` cannot run the coreference probe (one line), or None when it can."""
    name = getattr(model, "name", "this model")
    if getattr(model, "tokenizer", None) is None:
        return f"coreference needs a tokenizer to find names and pronouns; {name!r} has none"
    if kinds(model):
        return None
    split = next((w for w in ("she", "Mary", "it", "keys") if not _is_one_token(model, w)), "she")
    try:
        _, offsets = body_offsets(model, split)
        pieces = [split[a:b] for a, b in offsets]
    except ProbeError as err:
        return f"coreference: the tokenizer of {name!r} cannot read the probe's words ({err})"
    return (f"coreference: the tokenizer of {name!r} does not keep names and pronouns as single tokens "
            f"({split!r} -> {pieces}); the coreference probe needs them whole (e.g. WordPiece or BPE)")


def _pick(seq: Any, gen: torch.Generator) -> Any:
    return seq[int(torch.randint(len(seq), (1,), generator=gen))]


def _fill(frame: str, lead: str, a: str, b: str, pron: str, pred: str) -> tuple[str, dict[str, tuple[int, int]]]:
    """``lead, frame`` with the slots filled, and each slot's character span."""
    text, spans, rest = f"{lead}, ", {}, frame
    for slot, word in (("{A}", a), ("{B}", b), ("{P}", pron), ("{V}", pred)):
        before, rest = rest.split(slot, 1)
        text += before
        spans[slot] = (len(text), len(text) + len(word))
        text += word
    return text + rest, spans


def example(kind: str, words: dict[str, list[str]], gen: torch.Generator) -> Example:
    """One random sentence of ``kind`` from the usable ``words``."""
    first_cls, second_cls = ("male", "female") if kind == "gender" else ("plural", "singular")
    if bool(torch.randint(2, (1,), generator=gen)):
        first_cls, second_cls = second_cls, first_cls
    a, b = _pick(words[first_cls], gen), _pick(words[second_cls], gen)
    referent_first = bool(torch.randint(2, (1,), generator=gen))
    ref_cls = first_cls if referent_first else second_cls
    other_cls = second_cls if referent_first else first_cls
    lead = _pick(LEADS, gen)
    if kind == "gender":
        frame, pred = _pick(GENDER_FRAMES, gen), _pick(GENDER_PREDICATES, gen)
        pred_ref = pred_other = pred
    else:
        frame, forms = _pick(NUMBER_FRAMES, gen), _pick(NUMBER_PREDICATES, gen)
        pred = forms[ref_cls == "plural"]
        pred_ref, pred_other = pred, forms[other_cls == "plural"]
    text, spans = _fill(frame, lead, a, b, PRONOUNS[ref_cls], pred)
    ref_word, other_word = (a, b) if referent_first else (b, a)
    art = "The " if kind == "number" else ""
    ref_span, other_span = (spans["{A}"], spans["{B}"]) if referent_first else (spans["{B}"], spans["{A}"])
    return Example(text, kind, spans["{P}"], ref_span, other_span, referent_first,
                   f"{art}{ref_word} {pred_ref}.", f"{art}{other_word} {pred_other}.")


def examples(model: Any, n: int, seed: int = 0) -> list[Example]:
    """``n`` sentences for ``model`` (kinds alternate when both are supported), or a ProbeError."""
    why = unsupported(model)
    if why:
        raise ProbeError(why)
    words, ok = usable_words(model), kinds(model)
    gen = torch.Generator().manual_seed(seed * 1009 + 11)
    return [example(ok[i % len(ok)], words, gen) for i in range(n)]


def rows(model: Any, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """The annotated prompt rows of :func:`examples`."""
    return [ex.row() for ex in examples(model, n, seed)]
