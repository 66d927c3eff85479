"""Token strings as the text they stand for: ``ĠParis`` is `` Paris``, ``Ċ`` is a newline.

Why: a Hugging Face tokenizer's vocabulary spells tokens in its own alphabet (byte-level BPE maps
every byte to a printable character, so a leading space is ``Ġ`` and a newline ``Ċ``; SentencePiece
writes ``▁``; WordPiece marks a word's continuation with ``##``). ``to_str_tokens`` returns those
spellings, which is right for looking tokens up and wrong for reading them. Every view that shows
tokens to a person reads them through :func:`readable_tokens`.

How: each token is decoded by the tokenizer itself, after an anchor token, and the anchor's own text
is cut off again (decoding one token alone drops a SentencePiece word's leading space). Special tokens
(``<|im_start|>``, ``[CLS]``) stay as they are spelled; headlens' own byte and character tokenizers
already return text. A byte-level token that holds part of a character decodes to ``�``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

ANCHORS = ("a", "▁a", "Ġa")  # a vocabulary entry that decodes to the letter a: the first one the vocabulary has


def readable_tokens(model: Any, tokens: Any) -> list[str]:
    """``model.to_str_tokens(tokens)`` with every ordinary token spelled as the text it stands for.

    >>> class Tok:  # a byte-level BPE vocabulary: a leading space is spelled "Ġ"
    ...     all_special_tokens = ["<s>"]
    ...     def get_vocab(self): return {"a": 0, "Ġthe": 1}
    ...     def convert_tokens_to_string(self, ts): return "".join(ts).replace("Ġ", " ")
    >>> class Model:
    ...     tokenizer = Tok()
    ...     def to_str_tokens(self, tokens): return ["<s>", "Ġthe"]
    >>> readable_tokens(Model(), None)
    ['<s>', ' the']
    """
    raw = list(model.to_str_tokens(tokens))
    tok = getattr(model, "tokenizer", None)
    if getattr(model, "native_tokenizer", None) is not None or not hasattr(tok, "convert_tokens_to_string"):
        return raw  # headlens' own tokenizers (and a model without one) already give text
    return spell(tok, raw)


def spell(tok: Any, raw: Sequence[str]) -> list[str]:
    """The text of each vocabulary string in ``raw`` under the Hugging Face tokenizer ``tok``."""
    special = set(getattr(tok, "all_special_tokens", []) or [])
    memo = _memo(tok)
    anchor = memo.setdefault("", _anchor(tok))
    out = []
    for t in raw:
        if t in special:
            out.append(t)
            continue
        if t not in memo:
            memo[t] = _decode(tok, t, anchor)
        out.append(memo[t])
    return out


def _memo(tok: Any) -> dict[str, Any]:
    """The tokenizer's own memo of vocabulary string -> text (kept on the object: it lives as long as it does)."""
    memo = getattr(tok, "_headlens_token_text", None)
    if memo is None:
        memo = {}
        try:
            tok._headlens_token_text = memo
        except AttributeError:  # a tokenizer that takes no attributes: decoded again next time
            pass
    return memo


def _anchor(tok: Any) -> str | None:
    try:
        vocab = tok.get_vocab()
    except Exception:  # a tokenizer without a readable vocabulary: tokens are decoded alone
        return None
    for a in ANCHORS:
        if a in vocab and _join(tok, [a]) == "a":
            return a
    return None


def _join(tok: Any, pieces: list[str]) -> str | None:
    try:
        return str(tok.convert_tokens_to_string(pieces))
    except Exception:  # a token the tokenizer cannot turn back into text
        return None


def _decode(tok: Any, token: str, anchor: str | None) -> str:
    if anchor is not None:
        both = _join(tok, [anchor, token])
        if both is not None and both.startswith("a"):
            return both[1:]
    alone = _join(tok, [token])
    return token if alone is None else alone
