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
* ``weighted-8heads``: as ``weighted`` with 8 heads of width 16 per layer;
* ``shipped``: the recipe as it is now (``weighted-strong`` for 5,000 steps).

``plain`` to ``weighted-8heads`` run 4,000 steps, about 40 min each on one CPU thread.
``--ablate`` checks a head causally on real code: the loss on closing brackets in held-out
stdlib windows with the head zero-ablated, against every other head of its layer.

    python analyses/code_bracket_variants.py [--variants windows,weighted] [--steps 4000]
        [--out artifacts/code_variants]
    python analyses/code_bracket_variants.py --score RUN.safetensors [RUN2.safetensors ...]
    python analyses/code_bracket_variants.py --ablate L2H2 [--model code]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from pathlib import Path
from typing import Any

CLOSERS = ")]}"
VARIANTS: dict[str, dict[str, Any]] = {  # name -> bracket_frac, closer weight, heads per layer, steps
    "plain": {"frac": 0.0, "weight": 1.0, "heads": 4, "steps": 4000},  # the recipe shipped until 2026-11
    "windows": {"frac": 0.5, "weight": 1.0, "heads": 4, "steps": 4000},
    "weighted": {"frac": 0.5, "weight": 5.0, "heads": 4, "steps": 4000},
    "weighted-strong": {"frac": 0.75, "weight": 10.0, "heads": 4, "steps": 4000},
    "weighted-8heads": {"frac": 0.5, "weight": 5.0, "heads": 8, "steps": 4000},
    "shipped": {"frac": 0.75, "weight": 10.0, "heads": 4, "steps": 5000},
}
DETECTORS = ["open_bracket", "open_bracket_hard", "bracket_matching"]


def variant_recipe(name: str) -> Any:
    """The `code` recipe changed as ``VARIANTS[name]`` says."""
    from headlens.training.recipes import get_recipe

    v, r = VARIANTS[name], get_recipe("code")
    cfg = dataclasses.replace(r.config, n_heads=v["heads"], d_head=r.config.d_model // v["heads"])
    weights = {ord(c): v["weight"] for c in CLOSERS} if v["weight"] != 1.0 else {}
    return dataclasses.replace(r, config=cfg, target_weights=weights, steps=v["steps"],
                               extra={**r.extra, "bracket_frac": v["frac"]})


def score(path: str | Path, n_prompts: int = 64) -> dict[str, Any]:
    """The best head per detector on held-out stdlib windows of 256 bytes."""
    import headlens
    from headlens.models.checkpoint import load_checkpoint

    table = headlens.classify(load_checkpoint(path), detectors=DETECTORS, corpus="stdlib", seq_len=256,
                              n_prompts=n_prompts)
    row: dict[str, Any] = {"run": str(path)}
    for det in DETECTORS:
        best = table[table.detector == det].sort_values("score").iloc[-1]
        row[det] = f"L{best.layer}H{best['head']} {best.score:.2f} (CI low {best.ci_low:.2f})"
        row[f"{det}_labelled"] = bool(best.label)
    return row


def closer_ablation(ref: str, head: str, n_windows: int = 96) -> Any:
    """Loss and type accuracy on closing brackets in held-out stdlib windows, clean and with each head
    of ``head``'s layer zero-ablated (the named head first)."""
    import pandas as pd
    import torch
    import torch.nn.functional as F

    import headlens
    from headlens.probes import data

    model = headlens.load(ref)
    toks = data.window_batch(torch.Generator().manual_seed(5), data.stdlib_corpus().heldout, n_windows, 255,
                             model.bos_token_id)  # (N, 256)
    inputs, targets = toks[:, :-1], toks[:, 1:]  # (N, 255) each
    closers = torch.tensor([ord(c) for c in CLOSERS])
    hard = torch.zeros_like(targets, dtype=torch.bool)  # targets whose opener is past a closed group
    for b, row in enumerate(targets):
        hard[b, data.hard_closer_positions(row.to(torch.uint8))] = True
    is_closer = torch.isin(targets, closers)
    layer = int(head[1:].split("H")[0])
    heads = [head] + [f"L{layer}H{h}" for h in range(model.n_heads) if f"L{layer}H{h}" != head]
    rows = []
    for ablated in [None, *heads]:
        with torch.no_grad(), (headlens.ablate(model, ablated) if ablated else contextlib.nullcontext()):
            logits = model(inputs)  # (N, 255, V)
        loss = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (N, 255)
        right = closers[logits[..., closers].argmax(-1)] == targets
        rows.append({"ablated": ablated or "none", "closer_loss": float(loss[is_closer].mean()),
                     "hard_closer_loss": float(loss[hard].mean()),
                     "closer_type_accuracy": float(right[is_closer].float().mean()),
                     "other_byte_loss": float(loss[~is_closer].mean())})
    table = pd.DataFrame(rows).round(3)
    table.attrs["n_closers"], table.attrs["n_hard"] = int(is_closer.sum()), int(hard.sum())
    return table


def main() -> None:
    import pandas as pd
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names of VARIANTS")
    parser.add_argument("--steps", type=int, default=None, help="optimiser steps (default: the variant's)")
    parser.add_argument("--out", type=Path, default=Path("artifacts/code_variants"))
    parser.add_argument("--score", nargs="+", default=None, help="only score these checkpoints")
    parser.add_argument("--ablate", default=None, help="a head (e.g. L2H2) to check on closing brackets")
    parser.add_argument("--model", default="code", help="model for --ablate")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.ablate:
        table = closer_ablation(args.model, args.ablate)
        print(f"{table.attrs['n_closers']} closing brackets ({table.attrs['n_hard']} hard) in held-out stdlib windows")
        print(table.to_string(index=False))
        return
    if args.score:
        paths = args.score
    else:
        from headlens.training.train import train

        paths = []
        for name in args.variants.split(","):
            print(f"training {name} ...", flush=True)
            result = train(variant_recipe(name), args.out / name, steps=args.steps, snapshots=0)
            print(f"  final loss {result.final_loss:.3f} in {result.wall_time_s:.0f} s", flush=True)
            paths.append(result.checkpoint)
    print(pd.DataFrame([score(p) for p in paths]).to_string(index=False))


if __name__ == "__main__":
    main()
