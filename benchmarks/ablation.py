"""Ablation sweeps: cached resume path vs naive full forwards, and attribution patching.

Side by side on the same model, probes and heads:

1. every single head, zero ablation, ``repeated_loss`` + ``first_half_loss``: ``sweep(fast=True)``
   (clean run cached, each ablation restarts at its layer, groups of a layer stacked) against
   ``sweep(fast=False)`` (one full hooked forward per head and per control). Same numbers;
   target: fast <= 0.6 x naive time.
2. attribution patching (one forward + one backward) against the exact effects: Spearman rank
   correlation, and its time.
3. on zoo ``induction-2l`` (when installed): ablating its induction heads vs random heads of the
   same layers on repeated-half loss (must be >= 1 nat more), with 95 % bootstrap CIs.

Run: ``python benchmarks/ablation.py [--model REF] [--threads 1]``. Times are the best of
``--repeats`` runs (the machine is shared); nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

import headlens
from headlens.ablation import Replacement
from headlens.attribution import attribution_patching, spearman
from headlens.metrics import make_task
from headlens.sweep import sweep

METRICS = ["repeated_loss", "first_half_loss"]


def bench_model(ref: str | None) -> Any:
    if ref:
        return headlens.load(ref)
    from headlens.zoo import ZOO

    if "code" in ZOO and ZOO["code"].available:
        return headlens.load("code")
    torch.manual_seed(0)  # stand-in of the code model's shape: GPT-2 style, byte-level, with MLPs
    cfg = headlens.ModelConfig(n_layers=4, n_heads=8, d_model=256, n_ctx=128, d_vocab=257)
    return headlens.GPT(cfg, name="random-4l8h").eval()


def best_time(fn: Any, repeats: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def sweep_vs_naive(model: Any, n_prompts: int, repeats: int) -> None:
    kw = dict(method="zero", metrics=METRICS, n_prompts=n_prompts, n_boot=200, attribution=False)
    t_fast, fast = best_time(lambda: sweep(model, fast=True, **kw), repeats)
    t_naive, naive = best_time(lambda: sweep(model, fast=False, **kw), repeats)
    diff = float((fast["ablated"] - naive["ablated"]).abs().max())
    print(f"model {model.name}: {model.n_layers} layers x {model.n_heads} heads, {n_prompts} prompts, "
          f"T={make_task(model, METRICS[0], n_prompts=2).tokens.shape[1]}")
    print(f"  single-head sweep, cached resume : {t_fast:7.3f} s")
    print(f"  single-head sweep, naive forwards: {t_naive:7.3f} s")
    print(f"  ratio fast / naive               : {t_fast / t_naive:7.3f}   (target <= 0.6)")
    print(f"  max |ablated fast - naive|       : {diff:.2e}")

    task = make_task(model, "repeated_loss", n_prompts=n_prompts)
    replacement = Replacement.build(model, range(model.n_layers), "zero")
    t_attr, est = best_time(lambda: attribution_patching(model, task, "repeated_loss", replacement), repeats)
    exact = fast[fast.metric == "repeated_loss"]["delta"].to_numpy()
    rho = spearman(est.mean(0).flatten().numpy(), exact)
    print(f"  attribution patching             : {t_attr:7.3f} s, Spearman vs exact deltas {rho:.3f}")


def induction_vs_random(n_prompts: int) -> None:
    from headlens.zoo import ZOO

    entry = ZOO.get("induction-2l")
    if entry is None or not entry.available:
        print("induction-2l: not installed in this checkout; skipped")
        return
    model = headlens.load("induction-2l")
    heads = entry.known_heads.get("induction", [])
    if not heads:
        print("induction-2l: its model card names no induction heads; skipped")
        return
    df = sweep(model, groups=[",".join(heads)], method="zero", metrics=METRICS, n_prompts=n_prompts,
               n_control=64, n_boot=2000, attribution=False)
    print(f"induction-2l: ablating induction heads {'+'.join(heads)} vs random heads of the same layers (zero)")
    for r in df.itertuples():
        print(f"  {r.metric:16s} clean {r.clean:.3f}  ablated {r.ablated:.3f}  "
              f"delta {r.delta:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]  "
              f"random {r.control_delta:+.3f} [{r.control_ci_low:+.3f}, {r.control_ci_high:+.3f}]  "
              f"excess [{r.excess_ci_low:+.3f}, {r.excess_ci_high:+.3f}]")
    rep = df[df.metric == "repeated_loss"].iloc[0]
    verdict = "PASS" if rep.excess_ci_low >= 1.0 else ("pass on the mean" if rep.delta - rep.control_delta >= 1 else "FAIL")
    print(f"  excess over random on repeated-half loss: {rep.delta - rep.control_delta:+.3f} nats "
          f"(95% CI low {rep.excess_ci_low:+.3f}; target >= 1 nat): {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="model reference (default: zoo 'code', else a random 4x8)")
    parser.add_argument("--n-prompts", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sweep_vs_naive(bench_model(args.model), args.n_prompts, args.repeats)
    induction_vs_random(args.n_prompts)


if __name__ == "__main__":
    main()
