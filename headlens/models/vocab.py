"""What a model's vocabulary looks like to a probe: specials, ordinary tokens, brackets.

Why this is its own module: probes must be built *through the model's tokenizer* so they
work for byte-level models, char-level alphabets and WordPiece alike. Three facts are
discovered once per model and cached on a small frozen record:

* the **layout** of special tokens around a text (``[BOS] body`` for causal models,
  ``[CLS] body [SEP]`` for BERT), read off ``model.to_tokens("")``;
* the **ordinary** token ids a random probe may draw (no special tokens, no BERT
  ``[unused7]`` placeholders, and for byte-level tokenizers only the printable ASCII bytes:
  a control byte or a lone UTF-8 fragment is text the model never saw, and a probe made of
  them measures how a head copes with noise, not what it does);
* the **bracket pairs** whose opener and closer are each one token of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from headlens.errors import HeadlensError

BRACKET_PAIRS = ("()", "[]", "{}", "<>")


@dataclass(frozen=True)
class Vocab:
    """Probe-relevant facts about one model's tokenizer.

    Attributes:
        prefix: special ids every prompt starts with (``[BOS]`` or ``[CLS]``).
        suffix: special ids every prompt ends with (``[SEP]`` for BERT, else empty).
        special: ids of special tokens (never drawn, never a target's key token).
        ordinary: ids a random probe may draw, ascending.
        brackets: ``(opener_id, closer_id)`` for each usable bracket pair.
        filler: ordinary, non-bracket ids that read as one "word" (bracket-probe filler).
        sep: string put between units of a bracket string so each stays one token.
    """

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    special: frozenset[int]
    ordinary: tuple[int, ...]
    brackets: tuple[tuple[int, int], ...]
    filler: tuple[int, ...]
    sep: str

    def wrap(self, body: list[int]) -> list[int]:
        """The full prompt for a body of ordinary ids: prefix + body + suffix."""
        return [*self.prefix, *body, *self.suffix]

    @property
    def n_special_positions(self) -> int:
        return len(self.prefix) + len(self.suffix)


def token_strings(model: Any) -> list[str]:
    """The readable string of every token id ``0 .. d_vocab-1``."""
    tok = model.tokenizer
    ids = list(range(model.cfg.d_vocab))
    if hasattr(tok, "convert_ids_to_tokens"):
        return [str(s) if s is not None else "" for s in tok.convert_ids_to_tokens(ids)]
    if hasattr(tok, "str_token"):
        n = getattr(tok, "d_vocab", len(ids))
        return [tok.str_token(i) if i < n else f"<unused{i}>" for i in ids]
    return [str(s) for s in model.to_str_tokens(torch.tensor(ids))]


def encode_body(model: Any, text: str) -> list[int]:
    """Token ids of ``text`` without any special tokens around it."""
    tok = model.tokenizer
    if hasattr(tok, "encode") and hasattr(tok, "alphabet"):  # native headlens Tokenizer
        return list(tok.encode(text))
    if callable(tok) and hasattr(tok, "all_special_ids"):  # Hugging Face tokenizer
        return list(tok(text, add_special_tokens=False)["input_ids"])
    ids = model.to_tokens(text, prepend_bos=False)[0].tolist()
    return [i for i in ids if i not in model.special_token_ids]


def _is_placeholder(s: str) -> bool:
    """BERT's ``[unused12]``/``[PAD]`` and GPT-style ``<|endoftext|>``/``<bos>`` strings."""
    return len(s) > 2 and ((s[0] == "[" and s[-1] == "]") or (s[0] == "<" and s[-1] == ">"))


def single_token(model: Any, text: str) -> int | None:
    """The one token ``text`` encodes to, or None (several tokens, or text the tokenizer cannot encode)."""
    try:
        ids = encode_body(model, text)
    except HeadlensError:
        return None
    return ids[0] if len(ids) == 1 else None


def _layout(model: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    empty = model.to_tokens("")[0].tolist()  # all special: [BOS] or [CLS, SEP]
    n_prefix = len(empty)
    # a non-empty text tells prefix from suffix: BERT puts SEP after the body
    for text in ("a", "x", "0", "("):
        body = None
        try:
            body = encode_body(model, text)
            full = model.to_tokens(text)[0].tolist()
        except HeadlensError:
            continue
        if body:
            n_prefix = next((i for i in range(len(full)) if full[i:i + len(body)] == body), len(empty))
            break
    return tuple(empty[:n_prefix]), tuple(empty[n_prefix:])


def vocab(model: Any) -> Vocab:
    """The :class:`Vocab` of ``model`` (computed once per model object).

    >>> from headlens import GPT, ModelConfig, Tokenizer
    >>> m = GPT(ModelConfig(1, 1, 8, 16, 6), tokenizer=Tokenizer.char_level("ab()x"))
    >>> v = vocab(m); v.prefix, v.brackets, v.filler
    ((5,), ((2, 3),), (0, 1, 4))
    """
    cached = getattr(model, "_headlens_vocab", None)
    if isinstance(cached, Vocab):
        return cached
    v = _build_vocab(model)
    try:
        model._headlens_vocab = v
    except (AttributeError, TypeError):
        pass
    return v


def _build_vocab(model: Any) -> Vocab:
    special = frozenset(int(i) for i in model.special_token_ids)
    if getattr(model, "tokenizer", None) is None:  # a checkpoint without a tokenizer: ids are all there is
        return _ids_only(model, special)
    strings = token_strings(model)
    byte_level = getattr(model.tokenizer, "kind", None) == "byte"
    ordinary = tuple(
        i for i, s in enumerate(strings)
        if i not in special and s and not _is_placeholder(s)
        and not (byte_level and not 0x20 <= i < 0x7F)  # bytes: printable ASCII only
    )
    brackets = []
    for pair in BRACKET_PAIRS:
        ids = (single_token(model, pair[0]), single_token(model, pair[1]))
        if None not in ids and ids[0] != ids[1] and ids[0] in ordinary and ids[1] in ordinary:
            brackets.append((int(ids[0]), int(ids[1])))
    bracket_ids = {i for p in brackets for i in p}
    sep = "" if _joins_cleanly(model, strings, ordinary) else " "
    filler = tuple(
        i for i in ordinary
        if i not in bracket_ids and strings[i].isalpha() and strings[i].isascii()
        and single_token(model, strings[i]) == i
    )
    prefix, suffix = _layout(model)
    return Vocab(prefix, suffix, special, ordinary, tuple(brackets), filler, sep)


def _joins_cleanly(model: Any, strings: list[str], ordinary: tuple[int, ...]) -> bool:
    """True when adjacent letters stay separate tokens (byte/char level), False for WordPiece/BPE."""
    letters = [strings[i] for i in ordinary if len(strings[i]) == 1 and strings[i].isalpha()][:2]
    if len(letters) < 2:
        return True
    try:
        return len(encode_body(model, letters[0] + letters[1])) == 2
    except HeadlensError:
        return False


def _ids_only(model: Any, special: frozenset[int]) -> Vocab:
    """The vocabulary of a model without a tokenizer: every non-special id of the config, no brackets.

    Causal models get the config's BOS in front when it has one; nothing tells an encoder's CLS.
    """
    try:
        prefix: tuple[int, ...] = (int(model.bos_token_id),) if model.is_causal else ()
    except HeadlensError:
        prefix = ()
    ordinary = tuple(i for i in range(model.cfg.d_vocab) if i not in special)
    return Vocab(prefix, (), special, ordinary, (), (), " ")


def first_position(model: Any) -> dict[str, Any]:
    """What position 0 of every probe holds and why: the provenance of the first-position statistics
    (``first_token``, ``sink``), since they measure attention *to that token*.

    A Hugging Face causal model says why through its ``prefix`` (:mod:`headlens.models.hf.prefix`); other
    models start with their own BOS (CLS for encoders), or with nothing when they have none.
    """
    prefix = getattr(model, "prefix", None)
    if prefix is not None and model.is_causal:
        return prefix.provenance()
    ids = list(vocab(model).prefix)
    if not ids:
        return {"token": "", "id": None, "rule": "none", "why": "prompts start with their first text token"}
    token = str(model.to_str_tokens(torch.tensor(ids))[0])
    why = "the model's BOS" if model.is_causal else "the encoder's CLS (its tokenizer adds it)"
    return {"token": token, "id": int(ids[0]), "rule": "model_bos" if model.is_causal else "cls", "why": why}
