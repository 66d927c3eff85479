"""Training and probe data for the zoo recipes: repeats, Python source, Dyck strings.

Every sampler takes a ``torch.Generator`` so that a seed fixes the whole data stream
(training on CPU is then bit-for-bit reproducible). Batches are ``(B, T)`` LongTensors
that start with the tokenizer's BOS token.
"""

from __future__ import annotations

import hashlib
import re
import string
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

# ---------------------------------------------------------------- induction-2l

# letters, digits and space: users can type words and numbers into the dashboard
INDUCTION_ALPHABET = string.ascii_lowercase + string.ascii_uppercase + string.digits + " "


def periodic_repeat_batch(
    gen: torch.Generator,
    batch: int,
    seq_len: int,
    n_symbols: int,
    bos: int,
    min_len: int = 5,
    max_len: int = 25,
) -> torch.Tensor:
    """Random tokens in which one random segment repeats periodically until the row ends.

    Each row draws a period ``L`` in ``[min_len, max_len]`` and a start ``p``; the
    segment ``x[p : p + L]`` is copied again and again from ``p + L`` to the end. Period
    and start vary per row, so no fixed positional offset predicts the copies: the
    cheapest solution is a previous-token head feeding an induction head.

    Returns:
        ``(batch, seq_len + 1)`` tokens, BOS first.
    """
    x = torch.randint(0, n_symbols, (batch, seq_len), generator=gen)  # (B, T)
    for b in range(batch):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=gen))
        start = int(torch.randint(0, seq_len - 2 * length + 1, (1,), generator=gen))
        segment = x[b, start : start + length].clone()
        for i in range(start + length, seq_len, length):
            n = min(length, seq_len - i)
            x[b, i : i + n] = segment[:n]
    bos_col = torch.full((batch, 1), bos, dtype=torch.long)
    return torch.cat([bos_col, x], dim=1)  # (B, T + 1)


def repeated_probe(
    gen: torch.Generator, n_prompts: int, seg_len: int, n_symbols: int, bos: int
) -> torch.Tensor:
    """``BOS + r + r`` with ``r`` drawn without replacement (no accidental repeats).

    Returns:
        ``(n_prompts, 2 * seg_len + 1)`` tokens.
    """
    if seg_len > n_symbols:
        raise ValueError(f"seg_len={seg_len} exceeds the {n_symbols} symbols (no replacement)")
    rows = []
    for _ in range(n_prompts):
        r = torch.randperm(n_symbols, generator=gen)[:seg_len]
        rows.append(torch.cat([torch.tensor([bos]), r, r]))
    return torch.stack(rows)  # (N, 2L + 1)


# ---------------------------------------------------------------- code (Python stdlib)


def stdlib_files() -> list[Path]:
    """The standard library's ``*.py`` files (no site-packages), sorted for determinism."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [
        f
        for f in root.rglob("*.py")
        if "site-packages" not in f.parts and "dist-packages" not in f.parts
    ]
    return sorted(files, key=lambda f: f.relative_to(root).as_posix())


def is_heldout(relpath: str, every: int = 20) -> bool:
    """Deterministic held-out split by file: about 1 file in ``every`` (by a hash of its path)."""
    digest = hashlib.sha1(relpath.encode()).digest()
    return int.from_bytes(digest[:4], "big") % every == 0


@dataclass(frozen=True)
class ByteCorpus:
    """Train and held-out byte streams (files joined by blank lines)."""

    train: torch.Tensor  # (N_train,) uint8
    heldout: torch.Tensor  # (N_heldout,) uint8
    n_train_files: int
    n_heldout_files: int


@lru_cache(maxsize=2)
def stdlib_corpus(max_bytes: int = 0) -> ByteCorpus:
    """Load the stdlib source as bytes, split by file. ``max_bytes`` > 0 truncates (for tests)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    train, held = bytearray(), bytearray()
    n_train = n_held = 0
    for f in stdlib_files():
        data = f.read_bytes() + b"\n\n"
        if is_heldout(f.relative_to(root).as_posix()):
            held += data
            n_held += 1
        else:
            train += data
            n_train += 1
        if max_bytes and len(train) >= max_bytes and len(held) > 0:
            break
    return ByteCorpus(
        train=torch.frombuffer(bytearray(train), dtype=torch.uint8),
        heldout=torch.frombuffer(bytearray(held), dtype=torch.uint8),
        n_train_files=n_train,
        n_heldout_files=n_held,
    )


def window_batch(gen: torch.Generator, stream: torch.Tensor, batch: int, seq_len: int, bos: int) -> torch.Tensor:
    """Random ``seq_len``-byte windows of ``stream``, each after a BOS.

    Returns:
        ``(batch, seq_len + 1)`` tokens.
    """
    starts = torch.randint(0, len(stream) - seq_len, (batch,), generator=gen)
    idx = starts[:, None] + torch.arange(seq_len)[None, :]  # (B, T)
    x = stream[idx].long()
    bos_col = torch.full((batch, 1), bos, dtype=torch.long)
    return torch.cat([bos_col, x], dim=1)  # (B, T + 1)


CODE_PAIRS = ["()", "[]", "{}"]


def hard_closer_positions(stream: torch.Tensor, pairs: list[str] | None = None) -> torch.Tensor:
    """Positions in ``stream`` of closers whose matching opener is not the nearest preceding opener.

    These are the closers a "last open bracket" heuristic gets wrong: a whole bracket group
    closes between the opener and its closer, as in ``f(a[1], b)``. Matching follows
    :func:`match_brackets` (a mismatch empties the stack), over the bracket bytes only.

    Returns:
        ``(N,)`` long positions, ascending.
    """
    pairs = pairs or CODE_PAIRS
    text = bytes(stream.numpy()).decode("latin-1")
    open_of = {p[1]: p[0] for p in pairs}
    stack: list[tuple[str, int]] = []
    last_open = -1
    hard: list[int] = []
    for m in re.finditer("[" + re.escape("".join(pairs)) + "]", text):
        c, i = m.group(), m.start()
        if c not in open_of:
            stack.append((c, i))
            last_open = i
        elif stack and stack[-1][0] == open_of[c]:
            if stack.pop()[1] != last_open:
                hard.append(i)
        else:
            stack.clear()
    return torch.tensor(hard, dtype=torch.long)


def bracket_window_batch(gen: torch.Generator, stream: torch.Tensor, hard: torch.Tensor, batch: int,
                         seq_len: int, bos: int, min_lead: int = 32) -> torch.Tensor:
    """Windows of ``stream`` that each hold a hard closer (see :func:`hard_closer_positions`).

    The closer lands at a uniform position in ``[min_lead, seq_len)`` of its window, so that
    its opener is usually inside the window too.

    Returns:
        ``(batch, seq_len + 1)`` tokens.
    """
    pick = hard[torch.randint(0, len(hard), (batch,), generator=gen)]  # (B,)
    lead = torch.randint(min_lead, seq_len, (batch,), generator=gen)  # (B,)
    starts = (pick - lead).clamp(0, len(stream) - seq_len)
    idx = starts[:, None] + torch.arange(seq_len)[None, :]  # (B, T)
    bos_col = torch.full((batch, 1), bos, dtype=torch.long)
    return torch.cat([bos_col, stream[idx].long()], dim=1)  # (B, T + 1)


# ---------------------------------------------------------------- dyck

DYCK_PAIRS = ["()", "[]", "{}", "<>"]
DYCK_FILLER = "xyz"
DYCK_ALPHABET = "".join(DYCK_PAIRS) + DYCK_FILLER
DYCK_OPENERS = "".join(p[0] for p in DYCK_PAIRS)
DYCK_CLOSERS = "".join(p[1] for p in DYCK_PAIRS)


def dyck_string(gen: torch.Generator, length: int, max_depth: int = 8, p_filler: float = 0.2) -> str:
    """One balanced string of exactly ``length`` characters (length even or filler-padded).

    A random walk over depth: open, close or filler, closing everything by the end.
    """
    out: list[str] = []
    stack: list[int] = []
    for i in range(length):
        k, left = len(stack), length - i
        u = float(torch.rand((), generator=gen))
        can_open = k < max_depth and k + 2 <= left  # room to open and still close it
        if k >= left:  # must close now to finish balanced
            action = "close"
        elif u < p_filler:
            action = "fill"
        elif can_open and k > 0:
            action = "open" if u < p_filler + (1 - p_filler) / 2 else "close"
        elif can_open:
            action = "open"
        elif k > 0:
            action = "close"
        else:
            action = "fill"
        if action == "open":
            t = int(torch.randint(0, len(DYCK_PAIRS), (1,), generator=gen))
            stack.append(t)
            out.append(DYCK_PAIRS[t][0])
        elif action == "close":
            out.append(DYCK_PAIRS[stack.pop()][1])
        else:
            out.append(DYCK_FILLER[int(torch.randint(0, len(DYCK_FILLER), (1,), generator=gen))])
    return "".join(out)


def dyck_batch(gen: torch.Generator, batch: int, seq_len: int, bos: int, max_depth: int = 8) -> torch.Tensor:
    """``(batch, seq_len + 1)`` tokens: BOS then a balanced Dyck string over :data:`DYCK_ALPHABET`."""
    index = {c: i for i, c in enumerate(DYCK_ALPHABET)}
    rows = []
    for _ in range(batch):
        s = dyck_string(gen, seq_len, max_depth=max_depth)
        rows.append([bos] + [index[c] for c in s])
    return torch.tensor(rows, dtype=torch.long)


def match_brackets(text: str | bytes, pairs: list[str] | None = None) -> dict[int, int]:
    """Closer position -> matching opener position, by a stack over ``pairs`` (unmatched skipped).

    For source code this ignores strings and comments: a close approximation, since most
    brackets in Python source are balanced syntax.
    """
    pairs = pairs or DYCK_PAIRS
    if isinstance(text, bytes):
        text = text.decode("latin-1")
    open_of = {p[1]: p[0] for p in pairs}
    openers = {p[0] for p in pairs}
    stack: list[tuple[str, int]] = []
    matches: dict[int, int] = {}
    for i, c in enumerate(text):
        if c in openers:
            stack.append((c, i))
        elif c in open_of:
            if stack and stack[-1][0] == open_of[c]:
                matches[i] = stack.pop()[1]
            else:
                stack.clear()  # mismatch: start over rather than guess
    return matches


# ---------------------------------------------------------------- needle (long-context retrieval)

def needle_row(gen: torch.Generator, seq_len: int, n_symbols: int, n_needles: int = 2,
               min_len: int = 8, max_len: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """One haystack row with ``n_needles`` needles, each inserted once and copied later.

    Needles hold distinct symbols, disjoint across needles; the haystack is drawn *with*
    replacement from the symbols no needle uses, so inside a row each needle token occurs
    only in its needle and its copy. Needle, copy and haystack gaps are placed at random
    (a copy always after its needle), so the copy distance ranges from a few tokens to the
    whole row: only a content-addressed head (previous token -> "where did this token occur,
    what followed it") predicts a copy.

    Returns:
        ``(tokens, copy)``: ``(seq_len,)`` ids (no BOS) and ``(seq_len,)`` bool, True at each
        copy step (the position holds N[i] of a copy and the next position holds N[i+1]).
    """
    lens = torch.randint(min_len, max_len + 1, (n_needles,), generator=gen).tolist()
    perm = torch.randperm(n_symbols, generator=gen)
    needles = [perm[sum(lens[:j]):sum(lens[:j + 1])] for j in range(n_needles)]
    hay_pool = perm[sum(lens):]
    free = seq_len - 2 * sum(lens)
    if free < 0 or len(hay_pool) == 0:
        raise ValueError(f"{n_needles} needles of up to {max_len} tokens do not fit {seq_len} tokens "
                         f"over {n_symbols} symbols")
    order = [j for j in range(n_needles) for _ in (0, 1)]  # each needle twice: first its original, then its copy
    order = [order[i] for i in torch.randperm(len(order), generator=gen).tolist()]
    cuts = torch.sort(torch.randint(0, free + 1, (len(order),), generator=gen)).values.tolist()  # gap ends
    x = hay_pool[torch.randint(0, len(hay_pool), (seq_len,), generator=gen)]
    copy = torch.zeros(seq_len, dtype=torch.bool)
    seen: set[int] = set()
    pos, used = 0, 0
    for j, cut in zip(order, cuts, strict=True):
        pos += cut - used  # haystack gap before this span
        used = cut
        n = needles[j]
        x[pos:pos + len(n)] = n
        if j in seen:
            copy[pos:pos + len(n) - 1] = True  # N[i] at pos + i predicts N[i+1]
        seen.add(j)
        pos += len(n)
    return x, copy


def needle_batch(gen: torch.Generator, batch: int, seq_len: int, n_symbols: int, bos: int, n_needles: int = 2,
                 min_len: int = 8, max_len: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` rows of :func:`needle_row` after a BOS.

    Returns:
        ``(tokens, weights)``: ``(batch, seq_len + 1)`` ids, and ``(batch, seq_len)`` float, 1 where
        the target ``tokens[:, t + 1]`` is a copy step's (the positions the training loss reads).
    """
    rows = [needle_row(gen, seq_len, n_symbols, n_needles, min_len, max_len) for _ in range(batch)]
    x = torch.stack([r[0] for r in rows])  # (B, T)
    copy = torch.stack([r[1] for r in rows])  # (B, T): position t holds N[i] of a copy
    bos_col = torch.full((batch, 1), bos, dtype=torch.long)
    tokens = torch.cat([bos_col, x], dim=1)  # (B, T + 1)
    weights = torch.cat([torch.zeros(batch, 1, dtype=torch.bool), copy[:, :-1]], dim=1)  # (B, T): input t+1 ↔ x_t
    return tokens, weights.float()
