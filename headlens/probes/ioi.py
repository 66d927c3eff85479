"""Indirect object identification (Wang et al. 2022): "When Mary and John went to the store, John gave a
drink to" -> " Mary".

Each prompt names two people, the indirect object (IO) and the subject (S); S is named again (S2) and the
model should predict IO at the end. Why it looks like this:

* **Names are found, not assumed.** A candidate name is used when its leading-space form (``" Mary"``)
  is one ordinary token of *this* model's tokenizer, and every prompt checks, through the tokenizer's
  character offsets, that each name slot is exactly that one token. A tokenizer that keeps fewer than
  :data:`MIN_NAMES` of them is refused in one line (:func:`unsupported`): byte and char tokenizers split
  every name.
* **Balanced.** Prompts alternate the two orders, ABBA (``IO and S ..., S ... to``) and BABA
  (``S and IO ..., S ... to``), so a head that reads a fixed name slot cannot pass as a name mover; the
  templates (twelve, after the paper's) cycle in pairs, one of each order.
* **The corrupted distribution** (the paper's ABC): the same prompt with S2 replaced by a third name
  unrelated to IO and S. Names are single tokens, so every corrupted prompt is position-aligned with its
  clean one (same length; only the S2 token differs), the reference path patching and resampling need.
* **Named positions** (:attr:`Probe.positions`): ``IO``, ``S1``, ``S1+1``, ``S2``, ``END`` (the last
  token, whose logits predict the answer), token indices of the full prompt (BOS included). The answers
  are ``answers[:, 0]`` (IO, correct) and ``answers[:, 1]`` (S, wrong). The annotations ``IO``, ``S1`` and
  ``S2`` mark, at the END row, those positions: the keys a name mover reads (``headlens.detectors.name_mover``).

Model calls: none, apart from tokenization.

>>> TEMPLATES[0].format(A="Mary", B="John", C="John", PLACE="store", OBJECT="drink")
'When Mary and John went to the store, John gave a drink to'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from headlens.errors import ProbeError
from headlens.probes.base import Probe
from headlens.probes.spans import body_offsets, span_tokens

# the paper's templates (Wang et al. 2022, BABA_TEMPLATES), cut before the answer; A and B the two
# names of the first clause, C the second mention of S (or, corrupted, a third name)
TEMPLATES = (
    "When {A} and {B} went to the {PLACE}, {C} gave a {OBJECT} to",
    "Then, {A} and {B} went to the {PLACE}. {C} gave a {OBJECT} to",
    "Then, {A} and {B} had a lot of fun at the {PLACE}. {C} gave a {OBJECT} to",
    "Then, {A} and {B} were working at the {PLACE}. {C} decided to give a {OBJECT} to",
    "Then, {A} and {B} were thinking about going to the {PLACE}. {C} wanted to give a {OBJECT} to",
    "Then, {A} and {B} had a long argument, and afterwards {C} said to",
    "After {A} and {B} went to the {PLACE}, {C} gave a {OBJECT} to",
    "When {A} and {B} got a {OBJECT} at the {PLACE}, {C} decided to give it to",
    "While {A} and {B} were working at the {PLACE}, {C} gave a {OBJECT} to",
    "While {A} and {B} were commuting to the {PLACE}, {C} gave a {OBJECT} to",
    "After the lunch, {A} and {B} went to the {PLACE}. {C} gave a {OBJECT} to",
    "Friends {A} and {B} found a {OBJECT} at the {PLACE}. {C} gave it to",
)
PLACES = ("store", "garden", "restaurant", "school", "hospital", "office", "house", "station")
OBJECTS = ("ring", "kiss", "bone", "basketball", "computer", "necklace", "drink", "snack")
NAMES = ("Mary", "John", "Tom", "James", "Dan", "Sid", "Martin", "Amy", "Paul", "Kate", "Anne", "Lisa",
         "Mark", "Sarah", "Rose", "Emma", "Alice", "Bob", "David", "Michael", "Robert", "William", "Thomas",
         "Peter", "George", "Henry", "Jack", "Frank", "Steven", "Kevin", "Laura", "Helen", "Jane", "Rachel",
         "Emily", "Susan", "Karen", "Julia", "Linda", "Anna", "Richard", "Joseph", "Charles", "Daniel",
         "Matthew", "Andrew", "Joshua", "Ryan", "Jacob", "Nicole", "Jessica", "Ashley", "Megan", "Hannah",
         "Victoria", "Grace", "Sophie", "Oliver", "Harry", "Lucy")
ORDERS = ("ABBA", "BABA")
MIN_NAMES = 8  # three distinct names per prompt, and enough of them that no pair dominates
POSITION_NAMES = ("IO", "S1", "S1+1", "S2", "END")


@dataclass
class IOIProbe(Probe):
    """IOI prompts, their corrupted twins and answers (see the module docstring).

    Attributes:
        texts: the clean prompts as text (no BOS).
        corrupted: the ABC prompts (S2 replaced by a third name), token for token aligned with ``prompts``.
        corrupted_texts: the same as text.
        answers: ``(N, 2)`` long: the IO token (correct) and the S token (wrong) each prompt ends before.
        names: ``(IO, S, third)`` per prompt.
        orders: ``"ABBA"`` or ``"BABA"`` per prompt.
        templates: the index into :data:`TEMPLATES` of each prompt.
    """

    texts: list[str] = field(default_factory=list)
    corrupted: list[torch.Tensor] = field(default_factory=list)
    corrupted_texts: list[str] = field(default_factory=list)
    answers: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 2, dtype=torch.long))
    names: list[tuple[str, str, str]] = field(default_factory=list)
    orders: list[str] = field(default_factory=list)
    templates: list[int] = field(default_factory=list)


def name_token(model: Any, name: str) -> int | None:
    """The id of ``" " + name`` when it is one ordinary token of ``model``'s tokenizer, else None."""
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        return None
    try:
        ids, _ = body_offsets(model, " " + name)
    except ProbeError:
        return None
    if len(ids) != 1 or ids[0] in set(model.special_token_ids):
        return None
    return int(ids[0])


def usable_names(model: Any) -> dict[str, int]:
    """Every candidate name ``model`` keeps as one token with its leading space, name -> token id."""
    found = {n: name_token(model, n) for n in NAMES}
    ids = [i for i in found.values() if i is not None]
    return {n: i for n, i in found.items() if i is not None and ids.count(i) == 1}


def unsupported(model: Any) -> str | None:
    """Why ``model`` cannot take the IOI probe (one line), or None when it can."""
    label = getattr(model, "name", "this model")
    if getattr(model, "tokenizer", None) is None:
        return f"ioi needs a tokenizer to find single-token names; {label!r} has none"
    if not model.is_causal:
        return f"ioi asks for the next token; {label!r} is bidirectional"
    names = usable_names(model)
    if len(names) >= MIN_NAMES:
        return None
    try:
        _, offsets = body_offsets(model, " Mary")
        pieces = [" Mary"[a:b] for a, b in offsets]
    except ProbeError as err:
        return f"ioi: the tokenizer of {label!r} cannot read the probe's names ({err})"
    return (f"ioi: the tokenizer of {label!r} keeps {len(names)} of {len(NAMES)} names as one token with a "
            f"leading space (' Mary' -> {pieces}); the IOI probe needs at least {MIN_NAMES}")


def _fill(template: str, a: str, b: str, c: str, place: str, obj: str) -> tuple[str, dict[str, tuple[int, int]]]:
    """The template with its slots filled, and the character span of each name slot (A, B, C)."""
    text, spans, rest = "", {}, template
    while "{" in rest:
        before, rest = rest.split("{", 1)
        slot, rest = rest.split("}", 1)
        text += before
        word = {"A": a, "B": b, "C": c, "PLACE": place, "OBJECT": obj}[slot]
        spans[slot] = (len(text), len(text) + len(word))
        text += word
    return text + rest, spans


def _tokens(model: Any, text: str, spans: dict[str, tuple[int, int]], ids: dict[str, int],
            want: dict[str, str]) -> tuple[list[int], dict[str, int]]:
    """Full prompt ids (BOS first) and the token position of each name slot; each slot must be its name's token."""
    body, offsets = body_offsets(model, text)
    where = {}
    for slot, span in spans.items():
        if slot not in want:
            continue
        hit, aligned = span_tokens(text, offsets, span)
        if len(hit) != 1 or not aligned or body[hit[0]] != ids[want[slot]]:
            raise ProbeError(f"ioi: in {text!r} the name {want[slot]!r} is not the single token it is alone "
                             f"(tokens {[text[a:b] for a, b in (offsets[h] for h in hit)]})")
        where[slot] = hit[0] + 1  # + BOS
    return [model.bos_token_id, *body], where


def ioi_probe(model: Any, n_prompts: int = 128, seed: int = 0, templates: Sequence[int] | None = None,
              orders: Sequence[str] = ORDERS) -> IOIProbe:
    """``n_prompts`` IOI prompts for ``model`` (orders alternate, templates cycle in ABBA/BABA pairs), their
    corrupted twins, answers and named positions; a ``ProbeError`` when the tokenizer keeps too few names.

    Args:
        model: any headlens model with a tokenizer (causal).
        n_prompts: how many prompts (at least 1).
        seed: seeds the names, places and objects.
        templates: indices into :data:`TEMPLATES` to use (default: all twelve).
        orders: ``("ABBA", "BABA")`` (default: both, alternating) or one of them.
    """
    why = unsupported(model)
    if why:
        raise ProbeError(why)
    use = list(range(len(TEMPLATES))) if templates is None else [int(t) for t in templates]
    if n_prompts < 1 or not use or not orders or not set(orders) <= set(ORDERS) \
            or not all(0 <= t < len(TEMPLATES) for t in use):
        raise ProbeError(f"ioi needs n_prompts >= 1, templates among 0..{len(TEMPLATES) - 1} and orders among "
                         f"{ORDERS}; got {n_prompts}, {templates}, {orders}")
    ids = usable_names(model)
    gen = torch.Generator().manual_seed(seed * 1009 + 31)
    out = IOIProbe("ioi", [], settings={"n_prompts": n_prompts, "seed": seed, "n_names": len(ids),
                                        "names": sorted(ids), "templates": use, "orders": list(orders),
                                        "corrupted": "ABC (S2 -> C)"})
    pos: dict[str, list[int]] = {k: [] for k in POSITION_NAMES}
    answers = []
    for i in range(n_prompts):
        order, t = orders[i % len(orders)], use[(i // len(orders)) % len(use)]
        (io, s, c), clean, corrupt, text, bad, where = _prompt(model, ids, gen, t, order)
        for key, value in zip(POSITION_NAMES, where, strict=True):
            pos[key].append(value)
        for key, at in (("IO", where[0]), ("S1", where[1]), ("S2", where[3])):  # what the END row may read
            marks = torch.full((len(clean),), -1, dtype=torch.long)
            marks[-1] = at
            out.annotations.setdefault(key, []).append(marks)
        out.prompts.append(torch.tensor(clean, dtype=torch.long))
        out.corrupted.append(torch.tensor(corrupt, dtype=torch.long))
        out.texts.append(text)
        out.corrupted_texts.append(bad)
        out.names.append((io, s, c))
        out.orders.append(order)
        out.templates.append(t)
        answers.append((ids[io], ids[s]))
    out.positions = {k: torch.tensor(v, dtype=torch.long) for k, v in pos.items()}
    out.answers = torch.tensor(answers, dtype=torch.long)  # (N, 2): IO, S
    out.settings["max_len"] = max(len(p) for p in out.prompts)
    return out


def _prompt(model: Any, ids: dict[str, int], gen: torch.Generator, t: int, order: str) -> tuple:
    """One prompt of template ``t`` in ``order``: its names (IO, S, C), clean and corrupted ids and texts, and
    its named positions (IO, S1, S1+1, S2, END)."""
    pool = sorted(ids)
    io, s, c = (pool[j] for j in torch.randperm(len(pool), generator=gen)[:3].tolist())
    place = PLACES[int(torch.randint(len(PLACES), (1,), generator=gen))]
    obj = OBJECTS[int(torch.randint(len(OBJECTS), (1,), generator=gen))]
    a, b = (io, s) if order == "ABBA" else (s, io)
    text, spans = _fill(TEMPLATES[t], a, b, s, place, obj)
    bad, bad_spans = _fill(TEMPLATES[t], a, b, c, place, obj)
    clean, at = _tokens(model, text, spans, ids, {"A": a, "B": b, "C": s})
    corrupt, _ = _tokens(model, bad, bad_spans, ids, {"C": c})
    if len(corrupt) != len(clean):
        raise ProbeError(f"ioi: {bad!r} is not token-aligned with {text!r}")
    io_pos, s1 = (at["A"], at["B"]) if order == "ABBA" else (at["B"], at["A"])
    return (io, s, c), clean, corrupt, text, bad, (io_pos, s1, s1 + 1, at["C"], len(clean) - 1)


def words() -> list[str]:
    """Every word and punctuation mark the probe can write (a word-level test tokenizer's vocabulary)."""
    import re

    text = " ".join([*TEMPLATES, *PLACES, *OBJECTS, *NAMES])
    return sorted(set(re.findall(r"\w+|[^\w\s{}]", re.sub(r"\{\w+\}", " ", text))))


def resolve(model: Any, prompts: Any, n_prompts: int = 128, seed: int = 0) -> IOIProbe | None:
    """The IOI probe when ``prompts`` names it (the string ``"ioi"`` or an :class:`IOIProbe`), else None.

    Any other single string is refused: prompts are a list of texts (``["one prompt"]``), or ``"ioi"``.
    """
    if isinstance(prompts, IOIProbe):
        return prompts
    if isinstance(prompts, str):
        if prompts.strip().lower() == "ioi":
            return ioi_probe(model, n_prompts, seed)
        raise ProbeError(f"prompts={prompts[:40]!r} is one string; give a list of prompts, or 'ioi' for the IOI probe")
    return None


def scan_probe(model: Any, n_prompts: int, seq_len: int, gen: torch.Generator) -> IOIProbe:
    """The IOI probe with the signature of the generated probes a scan builds (``seq_len`` does not apply:
    each prompt is as long as its template; the seed is drawn from ``gen``)."""
    return ioi_probe(model, n_prompts, seed=int(torch.randint(2**31 - 1, (1,), generator=gen)))
