"""Seeded corruptions of real model files, for the readers' fuzz tests (tests/models/test_fuzz_readers.py).

A case is a real file with bytes flipped in its header, its index or its data, cut at a random offset,
or with one of its length fields set to a huge value. The length fields are found in the honest file
by searching for each known string with its uint64 length in front (a key, a tensor name), so the
search does not restate the reader under test.

A case is ``(label, prefix, size)``: the file is ``prefix`` followed by zeros up to ``size`` bytes
(:func:`write_case` makes the zeros a sparse hole), so a 98 MB GGUF costs only its 1.8 MB header per case.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator
from pathlib import Path

HUGE = (2**64 - 1, 2**63, 2**63 - 1, 2**40, 2**32, 2**32 - 1)
Case = tuple[str, bytes, int]


def length_fields(blob: bytes, strings: list[str], limit: int) -> list[int]:
    """Where, in ``blob[:limit]``, each of ``strings`` is stored with its uint64 length in front."""
    found = []
    for text in strings:
        raw = text.encode()
        at = blob.find(struct.pack("<Q", len(raw)) + raw, 0, limit)
        if at >= 0:
            found.append(at)
    return found


def mutations(blob: bytes, regions: dict[str, tuple[int, int]], lengths: list[int], n: int, seed: int,
              size: int | None = None) -> Iterator[Case]:
    """``n`` seeded corruptions of ``blob``: a quarter each flips bytes in a region (``header``, ``index``,
    ``data``, cycling), cuts the file, sets a length field (``lengths``: byte offsets) to a huge or
    off-by-some value, or writes a random uint64 anywhere in the index. ``blob`` may be the first bytes of a
    file of ``size`` bytes (default ``len(blob)``): the rest stays a hole of zeros."""
    rng = random.Random(seed)
    keep, size = len(blob), len(blob) if size is None else size
    names = list(regions)
    for i in range(n):
        out = bytearray(blob[:keep])
        op = i % 4
        if op == 0:
            region = names[(i // 4) % len(names)]
            lo, hi = regions[region]
            hi = min(hi, keep)
            for _ in range(rng.randint(1, 4)):
                at = rng.randrange(lo, hi)
                out[at] ^= rng.randrange(1, 256)
            yield f"flip-{region}-{i}", bytes(out), size
        elif op == 1:
            cut = rng.randrange(0, size)
            yield f"cut-at-{cut}", bytes(out[:cut]), cut
        elif op == 2 and lengths:
            at = rng.choice(lengths)
            (was,) = struct.unpack_from("<Q", out, at)
            value = rng.choice([*HUGE, was + rng.randint(1, 64), max(was - rng.randint(1, 8), 0), size])
            struct.pack_into("<Q", out, at, value)
            yield f"length-{at}-{value}", bytes(out), size
        else:
            lo, hi = regions.get("index", (0, keep))
            at = rng.randrange(lo, min(hi, keep) - 8)
            struct.pack_into("<Q", out, at, rng.choice(HUGE))
            yield f"huge-at-{at}", bytes(out), size


def write_case(path: Path, prefix: bytes, size: int) -> Path:
    """The file ``prefix`` + zeros up to ``size`` bytes (a sparse hole: nothing written past the prefix)."""
    with open(path, "wb") as f:
        f.write(prefix)
        f.truncate(size)
    return path
