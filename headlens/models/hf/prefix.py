"""What every prompt starts with on a Hugging Face causal LM: the token at position 0.

Why it looks like this:

* **Position 0 is not neutral.** Most heads of a trained LM rest on the first token (Xiao et al.
  2023), so what sits there shapes every pattern, and the ``first_token``/``sink`` statistics are
  statistics *of that token*. TransformerLens prepends the tokenizer's ``bos_token`` to every prompt
  whatever the tokenizer itself does; that is right when the tokenizer adds that token (Llama, Gemma,
  Mistral: the model saw it before every document), and a guess when it does not.
* **The rule, for any family** (:func:`choose`):

  1. the tokenizer adds a BOS itself (``add_bos_token``, or its post-processor puts one first):
     that token, as the model was trained and is served;
  2. it adds none, and the vocabulary has ``<|endoftext|>``: that token. It is the document
     separator of the byte-level BPE vocabularies that add no BOS (GPT-2, GPT-NeoX, StarCoder,
     Qwen, SmolLM, Phi): in pretraining a document starts right after it;
  3. else the ``bos_token`` the tokenizer declares (TransformerLens' choice), else its EOS;
  4. else nothing: position 0 holds the text's first token.

  A chat model's declared BOS can be a chat-turn marker (SmolLM2-Instruct's is ``<|im_start|>``):
  rule 2 keeps turn markers out of plain-text probes.
* **Said, not silent.** When the token chosen is not the declared ``bos_token`` (rules 2-4), one line
  says so at load (:meth:`Prefix.note`); every scores table records what position 0 holds
  (``attrs["first_position"]``, :func:`headlens.models.vocab.first_position`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DOCUMENT_SEPARATOR = "<|endoftext|>"
RULES = {
    "adds_bos": "the tokenizer adds this BOS itself",
    "document_separator": f"the tokenizer adds no BOS; {DOCUMENT_SEPARATOR}, the pretraining document separator",
    "declared_bos": "the tokenizer adds no BOS; the bos_token it declares (as TransformerLens prepends it)",
    "eos": "the tokenizer adds and declares no BOS; its EOS, which ends the document before",
    "none": "the tokenizer has no BOS, EOS or document separator: position 0 is the text's first token",
}


@dataclass(frozen=True)
class Prefix:
    """The token every prompt of a causal HF model starts with, and why.

    Attributes:
        token_id: its id (None: prompts start with their first text token).
        token: its string (``""`` when None).
        rule: a key of :data:`RULES`.
        declared_bos: the ``bos_token`` the tokenizer declares (None if it declares none).
        adds_bos: whether the tokenizer adds a BOS itself (None: it does not say).
    """

    token_id: int | None
    token: str
    rule: str
    declared_bos: str | None = None
    adds_bos: bool | None = None

    def note(self, name: str) -> str | None:
        """One line when position 0 is not the declared ``bos_token`` (a choice headlens made), else None."""
        if self.rule in ("adds_bos", "declared_bos") or self.token == self.declared_bos:
            return None
        held = {"document_separator": f"{self.token!r} (id {self.token_id}), the pretraining document separator",
                "eos": f"{self.token!r} (id {self.token_id}), its EOS",
                "none": f"their first text token (it has no BOS, EOS or {DOCUMENT_SEPARATOR})"}[self.rule]
        declared = f"its bos_token {self.declared_bos!r}" if self.declared_bos else "a BOS (it declares none)"
        return f"{name!r}: its tokenizer adds no BOS, so prompts start with {held}, not {declared} (docs/real-models.md)"

    def provenance(self) -> dict[str, Any]:
        return {"token": self.token, "id": self.token_id, "rule": self.rule, "why": RULES[self.rule],
                "declared_bos": self.declared_bos, "tokenizer_adds_bos": self.adds_bos}


def _post_processor_adds(post: Any) -> bool | None:
    """Whether a ``tokenizer.json`` post-processor puts a special token first (None: cannot tell)."""
    if not isinstance(post, dict):
        return False if post is None else None
    kind = post.get("type")
    if kind == "TemplateProcessing":
        single = post.get("single") or []
        return bool(single) and "SpecialToken" in single[0]
    if kind in ("BertProcessing", "RobertaProcessing"):
        return True
    if kind == "Sequence":
        found = [_post_processor_adds(p) for p in post.get("processors", [])]
        return True if True in found else (None if None in found else False)
    return False  # ByteLevel and the like add nothing


def adds_bos(folder: Path) -> bool | None:
    """Whether the tokenizer in ``folder`` adds a BOS by itself, as the directory ships it.

    ``tokenizer_config.json``'s ``add_bos_token`` when it says, else the post-processor in
    ``tokenizer.json``; None when neither tells (a slow tokenizer only).
    """
    for name, read in (("tokenizer_config.json", lambda d: d.get("add_bos_token")),
                       ("tokenizer.json", lambda d: _post_processor_adds(d.get("post_processor")))):
        try:
            data = json.loads((folder / name).read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue
        value = read(data)
        if isinstance(value, bool):
            return value
    return None


def choose(tokenizer: Any, adds: bool | None, d_vocab: int | None = None) -> Prefix:
    """The first token of every prompt by the rule of this module's docstring.

    ``d_vocab``: the model's vocabulary size; a token the tokenizer added beyond it (transformers adds a
    missing ``<|endoftext|>`` to GPT-2-style tokenizers built from a GGUF) is not one the model knows.

    >>> from types import SimpleNamespace as NS
    >>> tok = NS(bos_token="<|im_start|>", bos_token_id=1, eos_token="<|im_end|>", eos_token_id=2,
    ...          get_vocab=lambda: {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2})
    >>> choose(tok, adds=False).token, choose(tok, adds=True).token
    ('<|endoftext|>', '<|im_start|>')
    """
    bos, bos_id = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "bos_token_id", None)
    declared = str(bos) if bos is not None and bos_id is not None else None
    if declared is not None and adds is not False:  # it adds it, or it does not say (as TransformerLens assumes)
        return Prefix(int(bos_id), declared, "adds_bos" if adds else "declared_bos", declared, adds)
    separator = tokenizer.get_vocab().get(DOCUMENT_SEPARATOR)
    if separator is not None and (d_vocab is None or int(separator) < d_vocab):
        return Prefix(int(separator), DOCUMENT_SEPARATOR, "document_separator", declared, adds)
    if declared is not None:
        return Prefix(int(bos_id), declared, "declared_bos", declared, adds)
    eos, eos_id = getattr(tokenizer, "eos_token", None), getattr(tokenizer, "eos_token_id", None)
    if eos is not None and eos_id is not None:
        return Prefix(int(eos_id), str(eos), "eos", declared, adds)
    return Prefix(None, "", "none", declared, adds)
