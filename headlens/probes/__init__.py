"""Probes: token batches a scan runs, each built through the model's own tokenizer.

A probe is a list of prompts (1-D token id tensors with the model's specials around them)
plus per-position annotations (bracket matches). Which detector reads which probe:

* ``random_tokens``: ordinary ids drawn **without replacement** (no accidental repeats, no
  special tokens): previous/next/current/first token. Longer than the vocabulary, they fill
  ``seq_len`` with replacement, repeats at least half the vocabulary apart (``draw_tokens``).
* ``repeated_segments``: ``[BOS] p + r + r`` with p and r drawn jointly without replacement,
  the repeat length and the offset ``len(p)`` varying per prompt (so a fixed-offset head cannot
  pass as an induction head): duplicate token, induction. Past twice the vocabulary, r is up to
  half of ``seq_len``, drawn with replacement the same way.

Every generated probe fills ``seq_len`` and says how it drew its tokens in ``settings``;
:func:`short_of` names a probe that could not (``classify`` warns once).
* ``brackets``: balanced strings over every bracket pair the tokenizer keeps as one token each,
  with filler; matches are computed on the *token* sequence, so they are right whatever the
  tokenizer did: bracket matching (and its hard subset).
* ``prompts``: the user's texts; every detector whose targets exist in them is scored.
* ``stdlib``: windows of real Python source from held-out files of the standard library
  (on every machine, and never in the ``code`` zoo model's training split), read like the
  user's texts; brackets are Python's ``()[]{}`` (``<`` and ``>`` are operators there).

Model calls: none, apart from tokenization.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    """``headlens.probes.X`` for the builders that lived in the old flat ``probes.py`` (deprecated: CHANGELOG.md)."""
    import importlib
    import warnings

    for module in ("base", "generated", "text"):
        mod = importlib.import_module(f"headlens.probes.{module}")
        if hasattr(mod, name) and not name.startswith("_"):
            warnings.warn(f"headlens.probes.{name} moved to headlens.probes.{module}.{name}; the old path goes "
                          f"in the next release", DeprecationWarning, stacklevel=2)
            return getattr(mod, name)
    raise AttributeError(f"module 'headlens.probes' has no attribute {name!r}")
