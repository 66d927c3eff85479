"""The needle-in-a-haystack probe: a needle span hidden at some depth of a long haystack, then copied.

Each prompt is ``[BOS] hay[:d] + N + hay[d:] + N``: a needle N of ``needle_len`` distinct ordinary
tokens inserted at depth d (a fraction of the haystack) and, at the end, N again, teacher-forced.
The second N's first token is the cue; from there every position q holding ``N[i]`` is a *copy
step* whose next token is ``N[i+1]``, and the ``needle_next`` annotation points q at the position
of ``N[i+1]`` in the inserted needle: the key a retrieval head attends to (Wu et al. 2024,
``nightdessert/Retrieval_Head``, who insert a sentence into long essays and ask for it back).

Haystacks:

* ``"random"``: ordinary tokens drawn **with** replacement (so any length is reachable) from the
  tokens the needle does not use: inside a prompt each needle token occurs only in the needle and
  its copy, so the copy target is unambiguous.
* ``"stdlib"``: held-out standard-library source, tokenized by the model (the corpus reader of
  :func:`headlens.probes.text.stdlib_windows`); the needle is still random tokens, which may also occur
  in the code.
* ``"prose"``: English documentation prose (:mod:`headlens.probes.prose`), as a real LM reads.

By default (:func:`default_haystack`) a model whose vocabulary holds words (a subword vocabulary of
thousands of tokens: a real LM) gets prose, as Wu et al. hide their needle in essays: a haystack of
random subword tokens is text no LM has read, and its retrieval heads are measured off their ground.
A byte- or character-level model (the zoo's, trained on random haystacks) keeps random tokens.

Prompt lengths and depths vary over a grid (several lengths up to ``seq_len``, several depths), one
fresh needle per prompt; the probe's ``settings`` say exactly what was built.

Model calls: none, apart from tokenization.
"""

from __future__ import annotations

from typing import Any

import torch

from headlens.errors import ProbeError
from headlens.models.vocab import vocab
from headlens.probes.base import Probe
from headlens.probes.text import stdlib_body

HAYSTACKS = ("random", "stdlib", "prose")
WORD_VOCAB = 1000  # ordinary tokens from which a vocabulary holds words, not bytes or characters (256 + merges)
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)  # where the needle sits, as a fraction of the haystack
NEEDLE_LEN = 16


def lengths_for(seq_len: int, needle_len: int) -> list[int]:
    """Prompt lengths of the grid: ``seq_len``, ``seq_len / 2`` and ``seq_len / 4`` while they hold 4 needles.

    >>> lengths_for(2048, 16)
    [512, 1024, 2048]
    >>> lengths_for(48, 16)
    [48]
    """
    out = [seq_len // f for f in (4, 2) if seq_len // f >= 4 * needle_len]
    return sorted({*out, seq_len})


def _stdlib_hay(model: Any, n: int, gen: torch.Generator) -> list[int]:
    """``n`` tokens of held-out stdlib source, from the start of a random line."""
    from headlens.probes import data

    stream = data.stdlib_corpus().heldout  # (N,) uint8
    span = min(8 * n + 64, len(stream) // 2 - 1)  # bytes enough for n tokens under any tokenizer
    start = int(torch.randint(0, max(1, len(stream) - 2 * span), (1,), generator=gen))
    return stdlib_body(model, stream, start, span, n, "haystack")


def _prose_hay(model: Any, n: int, gen: torch.Generator) -> list[int]:
    """``n`` tokens of English prose, from the start of a random paragraph."""
    from headlens.models.vocab import encode_body
    from headlens.probes.prose import prose_corpus

    text = prose_corpus()
    span = 12 * n + 64  # characters enough for n tokens under any tokenizer
    start = int(torch.randint(0, max(1, len(text) - span), (1,), generator=gen))
    start = text.find("\n", start) + 1
    return encode_body(model, text[start:start + span])[:n]


def needle_prompt(model: Any, length: int, depth: float, needle_len: int, haystack: str,
                  gen: torch.Generator) -> tuple[list[int], list[int]]:
    """One prompt of ``length`` tokens (specials included) and its ``needle_next`` annotation."""
    v = vocab(model)
    pool = torch.tensor(v.ordinary, dtype=torch.long)
    perm = torch.randperm(len(pool), generator=gen)
    needle = pool[perm[:needle_len]].tolist()
    n_hay = length - v.n_special_positions - 2 * needle_len
    if haystack == "random":
        rest = pool[perm[needle_len:]]  # the needle's tokens never occur in the haystack
        hay = rest[torch.randint(0, len(rest), (n_hay,), generator=gen)].tolist()
    elif haystack == "prose":
        hay = _prose_hay(model, n_hay, gen)
    else:
        hay = _stdlib_hay(model, n_hay, gen)
    d = round(depth * len(hay))
    body = hay[:d] + needle + hay[d:] + needle
    ids = v.wrap(body)
    start = len(v.prefix) + d  # position of N[0] in the inserted needle
    copy = len(v.prefix) + len(hay) + needle_len  # position of N[0] in the copy
    nxt = [-1] * len(ids)
    for i in range(needle_len - 1):
        nxt[copy + i] = start + i + 1  # x_q = N[i] predicts N[i+1], which sits at start + i + 1
    return ids, nxt


def default_haystack(model: Any) -> str:
    """``"prose"`` for a model whose vocabulary holds words (a real LM), else ``"random"`` (module docstring)."""
    return "prose" if getattr(model, "tokenizer", None) is not None and len(vocab(model).ordinary) >= WORD_VOCAB \
        else "random"


def needle_haystack(model: Any, n_prompts: int, seq_len: int, gen: torch.Generator, haystack: str | None = None,
                    needle_len: int = NEEDLE_LEN, depths: tuple[float, ...] = DEPTHS) -> Probe:
    """``n_prompts`` needle-in-a-haystack prompts over a grid of lengths (up to ``seq_len``) and depths.

    Prompt i has length ``lengths[i % n_lengths]`` and depth ``depths[(i // n_lengths) % n_depths]``.
    The needle is shortened when the vocabulary or the length is too small for it (said in the settings).
    ``haystack``: one of :data:`HAYSTACKS`; None for :func:`default_haystack`.

    Raises:
        ProbeError: an unknown haystack, or ``seq_len`` too short for a needle of 2 tokens and its copy.
    """
    haystack = haystack or default_haystack(model)
    if haystack not in HAYSTACKS:
        raise ProbeError(f"unknown haystack {haystack!r}; expected one of {', '.join(HAYSTACKS)}")
    v = vocab(model)
    room = seq_len - v.n_special_positions
    n = min(needle_len, len(v.ordinary) // 2, room // 4)
    if n < 2:
        raise ProbeError(f"seq_len={seq_len} leaves no room for a needle, its copy and a haystack; need >= "
                         f"{v.n_special_positions + 8} tokens")
    lengths = lengths_for(seq_len, n)
    prompts, nexts, built = [], [], []
    for i in range(n_prompts):
        length, depth = lengths[i % len(lengths)], depths[(i // len(lengths)) % len(depths)]
        ids, nxt = needle_prompt(model, length, depth, n, haystack, gen)
        prompts.append(torch.tensor(ids, dtype=torch.long))
        nexts.append(torch.tensor(nxt, dtype=torch.long))
        built.append(len(ids))
    settings = {"seq_len": seq_len, "haystack": haystack, "needle_len": n, "lengths": lengths,
                "depths": list(depths), "copy_steps_per_prompt": n - 1,
                "built": f"{n_prompts} prompts [BOS] hay[:d] + needle + hay[d:] + needle over lengths {lengths} "
                         f"x depths {list(depths)}, one random needle of {n} distinct tokens each, "
                         + ("haystack drawn with replacement from the tokens the needle does not use"
                            if haystack == "random" else f"haystack from the {haystack} corpus")}
    if n < needle_len:
        settings["note"] = f"needle shortened from {needle_len} to {n} tokens to fit the vocabulary and length"
    return Probe("needle", prompts, {"needle_next": nexts}, settings=settings)
