"""Tokenizers for native models: bytes, or a fixed alphabet of characters.

Both round-trip every string they accept. The spec is a small JSON dict stored in the
checkpoint header, so a checkpoint always knows how its tokens read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from headlens.errors import ProbeError


@dataclass(frozen=True)
class Tokenizer:
    """Byte-level (ids 0-255 are bytes) or character-level over ``alphabet``; BOS is the last id.

    >>> tok = Tokenizer.byte_level()
    >>> tok.decode(tok.encode("héllo (x)"))
    'héllo (x)'
    """

    kind: Literal["byte", "char"]
    alphabet: str = ""  # the characters of a char-level vocabulary, id = index

    def __post_init__(self) -> None:
        if self.kind not in ("byte", "char"):
            raise ProbeError(f"tokenizer kind must be 'byte' or 'char', got {self.kind!r}")

    @classmethod
    def byte_level(cls) -> Tokenizer:
        return cls(kind="byte")

    @classmethod
    def char_level(cls, alphabet: str) -> Tokenizer:
        if len(set(alphabet)) != len(alphabet):
            raise ProbeError(f"alphabet has repeated characters: {alphabet!r}")
        return cls(kind="char", alphabet=alphabet)

    @property
    def n_symbols(self) -> int:
        return 256 if self.kind == "byte" else len(self.alphabet)

    @property
    def bos_token_id(self) -> int:
        return self.n_symbols

    @property
    def d_vocab(self) -> int:
        return self.n_symbols + 1

    def encode(self, text: str) -> list[int]:
        if self.kind == "byte":
            return list(text.encode("utf-8"))
        index = {c: i for i, c in enumerate(self.alphabet)}
        bad = sorted({c for c in text if c not in index})
        if bad:
            raise ProbeError(
                f"characters {bad!r} are not in this model's alphabet {self.alphabet!r}"
            )
        return [index[c] for c in text]

    def decode(self, ids: list[int] | torch.Tensor) -> str:
        ids = [int(i) for i in ids if int(i) != self.bos_token_id]
        if self.kind == "byte":
            return bytes(ids).decode("utf-8", errors="replace")
        return "".join(self.alphabet[i] for i in ids)

    def str_token(self, token_id: int) -> str:
        """Readable form of one token id (BOS as ``<bos>``, bytes via latin-1 or hex)."""
        if token_id == self.bos_token_id:
            return "<bos>"
        if self.kind == "char":
            return self.alphabet[token_id]
        ch = bytes([token_id]).decode("latin-1")
        return ch if ch.isprintable() else f"\\x{token_id:02x}"

    def to_spec(self) -> dict[str, Any]:
        return {"kind": self.kind, "alphabet": self.alphabet}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> Tokenizer:
        return cls(kind=spec["kind"], alphabet=spec.get("alphabet", ""))
