"""The first layers' heads in the substitution test: run exactly to block K, then to first order, against exact.

The heads of the first :data:`headlens.atlas.firstorder.EXACT_LAYERS` layers are where the plain first-order
estimate fails (a change there is amplified nonlinearly by the next layers), and run exactly they are most of the
substitution's cost. With ``EXACT_TO = K`` they run exactly through the blocks before ``K`` only, and the loss
change is taken to first order at the residual stream entering block ``K`` (one gradient, from the same backward
pass as the first-order estimates). This sets that against the exact values of a saved atlas (``benchmarks/atlas.py
--save FILE``, whose first layers ran exactly) on the same windows, for each ``K`` of ``--depths``: per head the
substituted and mean-ablated loss changes (relative error, Spearman, inside the exact interval of the mean
ablation) and the share kept (error, within 0.1, inside the exact interval).

Run: ``OMP_NUM_THREADS=1 flock /tmp/heavy.lock python benchmarks/atlas_hybrid.py --saved FILE --depths 2 3 4 6``
(with the ``--model``, ``--n-windows``, ``--seq-len`` the saved atlas was built with).
"""

from __future__ import annotations

import argparse
import pickle
import time

import numpy as np
import torch

import headlens
from headlens.atlas import firstorder
from headlens.atlas.corpus import corpus_windows, split
from headlens.atlas.describe import _classes
from headlens.atlas.exemplars import AtlasConfig
from headlens.atlas.rules import candidate_rules
from headlens.atlas.substitute import substitute
from headlens.interventions.attribution import spearman
from headlens.models.token_text import readable_tokens


def _compare(exact: dict, got: dict, label: str) -> None:
    """One line of figures over the heads of ``exact`` (head -> Description, run exactly) against ``got``."""
    keys = sorted(exact)
    ex_sub = np.array([exact[k].evidence["subst_delta"] for k in keys])
    ex_abl = np.array([exact[k].ablation_delta for k in keys])
    g_sub = np.array([got[k][0] for k in keys])
    g_abl = np.array([got[k][1] for k in keys])
    rel = lambda a, b: np.abs(a - b) / np.maximum(np.abs(b), 1e-12)  # noqa: E731
    in_abl = [exact[k].evidence["abl_lo"] <= got[k][1] <= exact[k].evidence["abl_hi"] for k in keys]
    shared = [k for k in keys if exact[k].share_kept is not None and got[k][2] is not None and got[k][2] == got[k][2]]
    moved = [k for k in shared if exact[k].evidence["abl_lo"] > 0 or exact[k].evidence["abl_hi"] < 0]
    line = (f"{label}: {len(keys)} heads; substituted: median rel. error {np.median(rel(g_sub, ex_sub)):.3f}, "
            f"Spearman {spearman(g_sub, ex_sub):.3f}; mean-ablated: median rel. error {np.median(rel(g_abl, ex_abl)):.3f}, "
            f"Spearman {spearman(g_abl, ex_abl):.3f}, sign right {np.mean(np.sign(g_abl) == np.sign(ex_abl)):.0%}, "
            f"inside the exact interval {np.mean(in_abl):.0%}")
    for name, group in (("with a share", shared), ("whose mean ablation moves the loss beyond its CI", moved)):
        if not group:
            continue
        es = np.array([exact[k].share_kept for k in group])
        gs = np.array([got[k][2] for k in group])
        inside = np.mean([exact[k].share_ci[0] <= got[k][2] <= exact[k].share_ci[1] for k in group])
        line += (f"\n    share kept, {len(group)} heads {name}: median |error| {np.median(np.abs(gs - es)):.3f}, "
                 f"max {np.max(np.abs(gs - es)):.3f}, within 0.1 {np.mean(np.abs(gs - es) <= 0.1):.0%}, inside the "
                 f"exact CI {inside:.0%}, Spearman {spearman(gs, es):.3f}")
    print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--corpus", default="prose")
    ap.add_argument("--n-windows", type=int, default=96)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--subst-windows", type=int, default=8)
    ap.add_argument("--saved", required=True, help="a pickle benchmarks/atlas.py --save wrote")
    ap.add_argument("--depths", type=int, nargs="+", default=[2, 3, 4, 6])
    ap.add_argument("--per-head", action="store_true", help="print each head's figures at every depth")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with open(args.saved, "rb") as f:
        descriptions = pickle.load(f)["descriptions"]
    exact = {(d.layer, d.head): d for d in descriptions
             if d.layer < firstorder.EXACT_LAYERS and d.evidence.get("share_how") == "exact"}
    model = headlens.load(args.model)
    config = AtlasConfig(corpus=args.corpus, n_windows=args.n_windows, seq_len=args.seq_len)
    _, held = split(corpus_windows(model, config.corpus, config.n_windows, config.seq_len, config.seed).prompts)
    classes = _classes(model, readable_tokens(model, torch.arange(int(model.cfg.d_vocab))))
    first = {k: (d.evidence["est_subst"], d.evidence["est_abl"], d.evidence["est_share"]) for k, d in exact.items()}
    _compare(exact, first, "first order at the head (the estimate today)")
    for depth in args.depths:
        firstorder.EXACT_TO = depth
        t = time.process_time()
        out, _ = substitute(model, descriptions, held, candidate_rules(), classes, args.subst_windows, n_exact=0)
        took = time.process_time() - t
        by = {(d.layer, d.head): d for d in out}
        drift = max(abs(by[k].evidence["est_subst"] - exact[k].evidence["est_subst"]) for k in exact)
        got = {k: (by[k].evidence["subst_delta"], by[k].ablation_delta, by[k].share_kept) for k in exact}
        _compare(exact, got, f"exact to block {depth} ({took:.1f} CPU s for the whole test; first-order drift "
                             f"from the saved run {drift:.1e})")
        if args.per_head:
            for k in sorted(exact):
                e = exact[k]
                print(f"  L{k[0]}H{k[1]}: subst {got[k][0]:+.4f} exact {e.evidence['subst_delta']:+.4f}; abl "
                      f"{got[k][1]:+.4f} exact {e.ablation_delta:+.4f} [{e.evidence['abl_lo']:+.4f}, "
                      f"{e.evidence['abl_hi']:+.4f}]; share {got[k][2]} exact {e.share_kept} {e.share_ci}")


if __name__ == "__main__":
    main()
