"""Re-score the zoo models with the dashboard's scan settings and ship the tables next to their weights.

``python -m headlens.app.ship_scores [NAME ...]``: every zoo model, or the ones named. The file format
and why the zoo ships scores at all are in :mod:`headlens.zoo.scores`.
"""

from __future__ import annotations

from headlens.zoo import ZOO
from headlens.zoo.scores import write


def main(names: list[str] | None = None) -> None:
    import sys

    import torch

    from headlens.app import helpers as hd
    from headlens.models.loading import load

    names = names if names is not None else sys.argv[1:]
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        raise SystemExit(f"unknown zoo model(s) {', '.join(unknown)}; known: {', '.join(ZOO)}")
    torch.set_num_threads(1)
    for name, entry in ZOO.items():
        if not entry.available or (names and name not in names):
            continue
        table = hd.compute_scores(load(name), n_prompts=hd.DEFAULT_N_PROMPTS, seed=0)
        print(f"{write(name, table, hd.DEFAULT_N_PROMPTS, 0)}: {len(table)} rows")


if __name__ == "__main__":
    main()
