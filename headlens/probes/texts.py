"""A text to show a model's heads at work: a repeated segment and nested brackets, in its own alphabet.

The dashboard prefills its text box with it and the HTML report draws each labelled head's
pattern on it: a repeat gives induction and duplicate-token heads something to do, brackets
give bracket heads theirs, and any text gives previous-token heads theirs.
"""

from __future__ import annotations

from typing import Any

from headlens.errors import ProbeError


def example_text(model: Any) -> str:
    """A prefilled text with a repeated segment and nested brackets, in the model's alphabet."""
    tok = getattr(model, "tokenizer", None)
    budget = int(model.cfg.n_ctx) - 1  # room for BOS
    if getattr(tok, "kind", None) == "char":
        text = _alphabet_example(tok.alphabet)
    elif getattr(tok, "kind", None) == "byte":
        text = ("def area(width, height):\n    return (width * height)\n\n"
                "def area(width, height):\n    return [width, (height)]\n")
    else:  # a Hugging Face tokenizer: words (a pronoun and two candidates for the coreference heads)
        text = ("John told Mary that she needed help. The quick brown fox (a red one) jumped over the lazy dog. "
                "The quick brown fox (a red one) jumped over the lazy dog.")
    return _fit(model, text, budget)


def _alphabet_example(alphabet: str) -> str:
    pairs = [p for p in ("()", "[]", "{}", "<>") if p[0] in alphabet and p[1] in alphabet]
    brackets = "".join(pairs)
    plain = [c for c in alphabet if c not in brackets and not c.isspace()]
    sep = " " if " " in alphabet else ""
    word = "".join(plain[(i * 7 + 3) % len(plain)] for i in range(min(10, len(plain)))) if plain else ""
    parts = [word, word, word[: len(word) // 2]] if word else []
    if pairs:
        filler = plain[0] if plain else ""
        nest = "".join(p[0] for p in pairs) + filler + "".join(p[1] for p in reversed(pairs))
        flat = "".join(pairs)
        parts += [nest + flat, nest + flat]
    return sep.join(parts)


def _fit(model: Any, text: str, budget: int) -> str:
    """Cut ``text`` until it tokenizes within ``budget`` tokens."""
    while text:
        try:
            if model.to_tokens(text).shape[1] <= budget + 1:
                return text
        except ProbeError:
            pass
        text = text[: max(1, int(len(text) * 0.8))] if len(text) > 1 else ""
    return text
