"""Does a bracket head form in the `code` model? Train recipe variants and score them on real code.

The `code` zoo recipe grows previous-token, induction and sink heads, but no head that tracks
brackets well enough to be labelled. This script trains variants of the recipe that push
harder on brackets, and scores every run's heads on held-out standard-library source
(``headlens.classify(corpus="stdlib")``) for ``open_bracket`` (attention from the position that
predicts a closer to the opener it closes), its hard subset and ``bracket_matching``:

* ``base``: the shipped recipe;
* ``windows``: half of every batch is windows around a *hard* closer (one whose opener is not the
  nearest preceding opener, as in ``f(a[1], b)``);
* ``weighted``: as ``windows``, and the loss on ``)]}`` targets weighs 5x;
* ``weighted-strong``: 3/4 of every batch around hard closers, closers weigh 10x;
* ``weighted-8heads``: as ``weighted`` with 8 heads of width 16 per layer.

Each variant costs the recipe's wall time (about 40 min on one CPU thread at 4,000 steps).

    python analyses/code_bracket_variants.py [--variants windows,weighted] [--steps 4000]
        [--out artifacts/code_variants]
    python analyses/code_bracket_variants.py --score RUN.safetensors [RUN2.safetensors ...]
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

CLOSERS = ")]}"
VARIANTS: dict[str, dict[str, Any]] = {  # name -> (bracket_frac, closer weight, heads per layer)
    "base": {"frac": 0.0, "weight": 1.0, "heads": 4},
    "windows": {"frac": 0.5, "weight": 1.0, "heads": 4},
    "weighted": {"frac": 0.5, "weight": 5.0, "heads": 4},
    "weighted-strong": {"frac": 0.75, "weight": 10.0, "heads": 4},
    "weighted-8heads": {"frac": 0.5, "weight": 5.0, "heads": 8},
}
DETECTORS = ["open_bracket", "open_bracket_hard", "bracket_matching"]


def variant_recipe(name: str) -> Any:
    """The `code` recipe changed as ``VARIANTS[name]`` says."""
    from headlens.zoo.recipes import get_recipe

    v, r = VARIANTS[name], get_recipe("code")
    cfg = dataclasses.replace(r.config, n_heads=v["heads"], d_head=r.config.d_model // v["heads"])
    weights = {ord(c): v["weight"] for c in CLOSERS} if v["weight"] != 1.0 else {}
    return dataclasses.replace(r, config=cfg, target_weights=weights,
                               extra={**r.extra, "bracket_frac": v["frac"]})


def score(path: str | Path, n_prompts: int = 64) -> dict[str, Any]:
    """The best head per detector on held-out stdlib windows of 256 bytes."""
    import headlens
    from headlens.checkpoint import load_checkpoint

    table = headlens.classify(load_checkpoint(path), detectors=DETECTORS, corpus="stdlib", seq_len=256,
                              n_prompts=n_prompts)
    row: dict[str, Any] = {"run": str(path)}
    for det in DETECTORS:
        best = table[table.detector == det].sort_values("score").iloc[-1]
        row[det] = f"L{best.layer}H{best['head']} {best.score:.2f} (CI low {best.ci_low:.2f})"
        row[f"{det}_labelled"] = bool(best.label)
    return row


def main() -> None:
    import pandas as pd
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names of VARIANTS")
    parser.add_argument("--steps", type=int, default=None, help="optimiser steps (default: the recipe's)")
    parser.add_argument("--out", type=Path, default=Path("artifacts/code_variants"))
    parser.add_argument("--score", nargs="+", default=None, help="only score these checkpoints")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.score:
        paths = args.score
    else:
        from headlens.zoo.train import train

        paths = []
        for name in args.variants.split(","):
            print(f"training {name} ...", flush=True)
            result = train(variant_recipe(name), args.out / name, steps=args.steps, snapshots=0)
            print(f"  final loss {result.final_loss:.3f} in {result.wall_time_s:.0f} s", flush=True)
            paths.append(result.checkpoint)
    print(pd.DataFrame([score(p) for p in paths]).to_string(index=False))


if __name__ == "__main__":
    main()
