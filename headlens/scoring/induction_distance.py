"""Induction by distance: how well each head copies as the gap between two copies grows (long contexts).

Definition (docs/scores.md, long-context detectors): the induction target restricted to rows whose
earlier copy lies g tokens back. On a prompt where a segment r reappears g tokens after its first
occurrence, a row q inside the second copy (``x_{q-g} = x_q`` and ``x_{q-1-g} = x_{q-1}``: a copy
of the context, not a chance repeat of one token) has the single target ``q - g + 1``, the token
that followed ``x_q`` the first time (Olsson et al. 2022's prefix matching, at a controlled
distance). The score at g is the attention mass on that target, pooled over rows and prompts as
every headlens score, with a bootstrap CI over prompts and the uniform baseline.

The probe for gap g: ``[BOS] p + r + f + r`` with ``len(p) = 16``, ``len(r) = 32`` and
``len(r + f) = g``, every token drawn by :func:`headlens.probes.generated.draw_tokens` (no repeats within
the vocabulary size, then repeats at least half a vocabulary apart), so the prompt is g + 49
tokens long. A curve runs g = 64, 128, ... up to 32,768 or the context, through the sparse scan
where T is large (``scan_path="auto"``): nothing O(T²) is stored.

Caveat: with a small vocabulary (95 printable bytes) x_q also occurs by chance many times between
the copies, and an induction head that matches on one token of context spreads its mass over
all of them; the curve then falls with g partly for that reason. Real tokenizers (V ~ 50k) do
not have the problem.

>>> gaps(8192)
[64, 128, 256, 512, 1024, 2048, 4096]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from headlens.detectors.base import Detector, finish_targets
from headlens.models.vocab import vocab
from headlens.probes.base import Probe, ProbeBatch
from headlens.probes.generated import draw_tokens

PREFIX, REPEAT = 16, 32  # tokens before the first copy; tokens in each copy
MAX_GAP = 32768


def gaps(n_ctx: int, start: int = 64, stop: int = MAX_GAP) -> list[int]:
    """Powers of two from ``start`` up to ``stop`` whose probe fits in ``n_ctx`` tokens."""
    out, g = [], start
    while g <= stop and g + PREFIX + REPEAT + 1 <= n_ctx:
        out.append(g)
        g *= 2
    return out


def gap_targets(batch: ProbeBatch, g: int) -> torch.Tensor:
    """``(B, Q, 1)``: ``q - g + 1`` at rows inside a copy of the context that lies g tokens back."""
    x = batch.tokens
    B = x.shape[0]
    r0, r1 = batch.row_range
    q = torch.arange(r0, r1, device=x.device)  # (Q,)
    ok = (q - g - 1 >= 0)[None, :].expand(B, -1).clone()  # (B, Q)
    back, back1 = (q - g).clamp_min(0), (q - g - 1).clamp_min(0)
    ok &= (x[:, q] == x[:, back]) & (x[:, (q - 1).clamp_min(0)] == x[:, back1])
    ok &= ~batch.special[:, back] & ~batch.special[:, back1]
    idx = torch.where(ok, (q - g + 1)[None, :].expand(B, -1), torch.full_like(ok, -1, dtype=torch.long))
    return finish_targets(idx[:, :, None], batch)


def detector(g: int) -> Detector:
    """The induction-at-distance-g detector (not in the registry: :func:`induction_curve` runs it)."""
    return Detector(f"induction@{g}", "index", lambda batch: gap_targets(batch, g), None,
                    f"induction onto a copy {g} tokens back", params={"g": g}, windowed=True)


def gap_probe(model: Any, n_prompts: int, g: int, gen: torch.Generator) -> Probe:
    """``n_prompts`` prompts ``[BOS] p + r + f + r`` with the second copy of r exactly g tokens later."""
    v = vocab(model)
    pool = torch.tensor(v.ordinary, dtype=torch.long)
    prompts = []
    for _ in range(n_prompts):
        body = draw_tokens(pool, PREFIX + g + REPEAT, gen)
        body[PREFIX + g:] = body[PREFIX:PREFIX + REPEAT]
        prompts.append(torch.tensor(v.wrap(body.tolist())))
    return Probe(f"induction_gap_{g}", prompts,
                 settings={"gap": g, "seq_len": len(prompts[0]) if prompts else 0, "prefix": PREFIX, "repeat": REPEAT})


def induction_curve(model: Any, gap_list: Sequence[int] | None = None, n_prompts: int = 8, seed: int = 0,
                    batch_size: int = 1, scan_path: str = "auto", n_boot: int = 1000) -> Any:
    """Induction score per head and gap: a second table next to ``classify``'s.

    Args:
        model: a loaded model (or a reference for ``headlens.load``).
        gap_list: the gaps g (default :func:`gaps` of the model's context, 64 .. 32,768).
        n_prompts: prompts per gap.
        seed: seeds the probes and the bootstrap.
        batch_size: prompts per forward pass.
        scan_path: ``"auto"``, ``"dense"`` or ``"sparse"`` (:mod:`headlens.scoring.engine`).
        n_boot: bootstrap resamples.

    Returns:
        a pandas DataFrame: ``model, layer, head, gap, score, ci_low, ci_high, baseline, lift,
        n_positions, n_prompts``; ``attrs`` holds the probe settings and the scan path per gap.
    """
    import pandas as pd

    from headlens.scoring.classification import resolve_model
    from headlens.scoring.scan import scan
    from headlens.scoring.stats import summarize

    model = resolve_model(model)
    gap_list = list(gap_list) if gap_list is not None else gaps(int(model.cfg.n_ctx))
    L, H = model.n_layers, model.n_heads
    rows, paths = [], {}
    for i, g in enumerate(gap_list):
        probe = gap_probe(model, n_prompts, g, torch.Generator().manual_seed(seed * 1009 + 101 + i))
        info: dict[str, Any] = {}
        st = scan(model, probe, [detector(g)], batch_size, path=scan_path, info=info)[f"induction@{g}"]
        paths[g] = info["scan_path"]
        s = summarize(st.sums.reshape(len(probe), L * H), st.counts, st.baseline, seed=seed, n_boot=n_boot)
        lift = s.lift
        for j in range(L * H):
            rows.append({"model": model.name, "layer": j // H, "head": j % H, "gap": g,
                         "score": float(s.score[j]), "ci_low": float(s.ci_low[j]), "ci_high": float(s.ci_high[j]),
                         "baseline": s.baseline, "lift": float(lift[j]), "n_positions": s.n_positions,
                         "n_prompts": s.n_prompts})
    df = pd.DataFrame(rows)
    df.attrs.update({"model": model.name, "seed": seed, "n_prompts": n_prompts, "prefix": PREFIX,
                     "repeat": REPEAT, "scan_path": paths, "definition": "induction target q-g+1 at rows "
                     "inside a copy of the context g tokens back"})
    return df
