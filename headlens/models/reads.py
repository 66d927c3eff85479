"""How many tokens a run feeds the model: every forward's ``(B, T)`` ids (pads included), counted at the
input embedding, so that a table's provenance lists what the run read (the scans, a gate's extra forwards, a
weight detector's), not what its probes hold."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class TokenLedger:
    """Tokens fed to ``model`` per named phase: ``with ledger("ioi"): ...`` adds what the forwards inside embed
    to ``ledger.read["ioi"]`` (this process's forwards; nothing is counted where the backend shows no input
    embedding module, and :meth:`summary` is then empty).

    >>> import torch, headlens
    >>> m = headlens.load("induction-2l")
    >>> ledger = TokenLedger(m)
    >>> with ledger("two prompts"):
    ...     _ = m(torch.zeros(2, 5, dtype=torch.long))
    >>> ledger.summary()
    {'two prompts': 10, 'total': 10}
    """

    def __init__(self, model: Any) -> None:
        bridge, native = getattr(model, "bridge", None), getattr(model, "transformer", None)
        self.module = getattr(bridge, "embed", None) if bridge is not None else getattr(native, "wte", None)
        self.read: dict[str, int] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if self.module is None:
            yield
            return

        def count(module: Any, args: tuple) -> None:
            if args and hasattr(args[0], "numel"):
                self.read[phase] = self.read.get(phase, 0) + int(args[0].numel())  # (B, T) ids

        handle = self.module.register_forward_pre_hook(count)
        try:
            yield
        finally:
            handle.remove()

    def summary(self) -> dict[str, int]:
        """``{phase: tokens, ..., "total": tokens}`` over the phases that read any (empty when none did)."""
        return {**self.read, "total": sum(self.read.values())} if self.read else {}
