"""Ablation sweeps: cached resume path vs naive full forwards, and attribution patching.

Side by side on the same model, probes and heads:

1. every single head, zero ablation, on ``repeated_loss`` (``bracket_accuracy`` for ``dyck``) and on
   ``repeated_loss`` + ``first_half_loss`` together: ``sweep(fast=True)``
   (clean run cached, each ablation restarts at its layer, groups of a layer stacked) against
   ``sweep(fast=False)`` (one full hooked forward per head and per control). Same numbers;
   target: fast <= 0.6 x naive time.
2. attribution patching (one forward + one backward) against the exact effects: Spearman rank
   correlation, and its time.
3. on zoo ``induction-2l`` (when installed): ablating its induction heads vs random heads of the
   same layers on repeated-half loss (must be >= 1 nat more), with 95 % bootstrap CIs.

Run: ``python benchmarks/ablation.py [--model REF] [--threads 1]``. Fast and naive runs are
interleaved ``--repeats`` times and timed in CPU seconds of this process (steadier than wall time
on a shared machine); the median of the per-pair ratios is reported. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

import headlens
from headlens.interventions.ablation import Replacement
from headlens.interventions.attribution import attribution_patching, spearman
from headlens.interventions.metrics import make_task
from headlens.interventions.sweep import sweep

METRICS = ["repeated_loss", "first_half_loss"]


def stand_in() -> Any:
    """A random model with the zoo ``code`` recipe's shape (3 layers x 4 heads, d_model 128, MLPs)."""
    torch.manual_seed(0)
    cfg = headlens.ModelConfig(n_layers=3, n_heads=4, d_model=128, n_ctx=256, d_vocab=257)
    return headlens.GPT(cfg, name="random, code-shaped").eval()


def zoo_model(name: str) -> Any:
    from headlens.zoo import ZOO

    return headlens.load(name) if name in ZOO and ZOO[name].available else None


def timed(fn: Any) -> tuple[float, float, Any]:
    """(CPU seconds of this process, wall seconds, result): CPU time is steadier on a shared machine."""
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c0, time.perf_counter() - w0, out


def sweep_vs_naive(model: Any, metrics: list[str], n_prompts: int, repeats: int) -> Any:
    """Interleaved fast / naive single-head sweeps; the median of the per-pair time ratios."""
    kw = dict(method="zero", metrics=metrics, n_prompts=n_prompts, n_boot=200, attribution=False)
    ratios, cpu_f, cpu_n, diff, fast = [], [], [], 0.0, None
    sweep(model, fast=True, **{**kw, "n_prompts": 2})  # warm-up: lazy imports, allocator
    for _ in range(repeats):
        cf, _, fast = timed(lambda: sweep(model, fast=True, **kw))
        cn, _, naive = timed(lambda: sweep(model, fast=False, **kw))
        cpu_f.append(cf)
        cpu_n.append(cn)
        ratios.append(cf / cn)
        diff = max(diff, float((fast["ablated"] - naive["ablated"]).abs().max()))
    print(f"  metrics {'+'.join(metrics)}: fast {statistics.median(cpu_f):6.2f} s, naive "
          f"{statistics.median(cpu_n):6.2f} s (CPU), ratio median {statistics.median(ratios):.3f} "
          f"(each: {', '.join(f'{r:.2f}' for r in ratios)}; target <= 0.6), max |ablated diff| {diff:.1e}")
    return fast


def attribution_check(model: Any, exact: Any, n_prompts: int) -> None:
    task = make_task(model, "repeated_loss", n_prompts=n_prompts)
    replacement = Replacement.build(model, range(model.n_layers), "zero")
    cpu, _, est = timed(lambda: attribution_patching(model, task, "repeated_loss", replacement))
    deltas = exact[exact.metric == "repeated_loss"]["delta"].to_numpy()
    rho = spearman(est.mean(0).flatten().numpy(), deltas)
    print(f"  attribution patching (1 fwd + 1 bwd): {cpu:.2f} s CPU, Spearman vs exact single-head deltas {rho:.3f}")


def induction_vs_random(ref: str, n_prompts: int, given: str | None = None) -> None:
    from headlens.zoo import ZOO

    if ref == "induction-2l" and ("induction-2l" not in ZOO or not ZOO["induction-2l"].available):
        print("induction-2l: not installed in this checkout; skipped")
        return
    model = headlens.load(ref)
    if given:
        heads = given.split(",")
    else:
        table = headlens.classify(model, detectors=["induction"], n_prompts=n_prompts)
        heads = [f"L{r.layer}H{r.head}" for r in table[table.label].itertuples()]
    if not heads and ref in ZOO:
        heads = ZOO[ref].known_heads.get("induction", [])
    if not heads:
        print(f"{ref}: no induction head labelled by classify or named by the model card; skipped")
        return
    df = sweep(model, groups=[",".join(heads)], method="zero", metrics=METRICS, n_prompts=n_prompts,
               n_control=64, n_boot=2000, attribution=False)
    print(f"{ref}: ablating induction heads {'+'.join(heads)} vs random heads of the same layers (zero)")
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
    parser.add_argument("--model", default=None, help="model reference (default: the zoo models, else a code-shaped random model)")
    parser.add_argument("--n-prompts", type=int, default=32)
    parser.add_argument("--induction-model", default="induction-2l", help="model for the induction-vs-random check")
    parser.add_argument("--induction-heads", default=None, help="e.g. L1H7 (default: classify's labels, else the card)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = [headlens.load(args.model)] if args.model else [m for m in map(zoo_model, ("code", "induction-2l", "dyck")) if m]
    if not models:
        models = [stand_in()]
    for model in models:
        task = make_task(model, "bracket_accuracy" if "dyck" in model.name else "repeated_loss", n_prompts=2)
        print(f"{model.name}: {model.n_layers} layers x {model.n_heads} heads, {args.n_prompts} prompts x "
              f"{task.tokens.shape[1]} tokens, single-head zero-ablation sweep, cached vs naive")
        primary = ["bracket_accuracy"] if "dyck" in model.name else ["repeated_loss"]
        exact = sweep_vs_naive(model, primary, args.n_prompts, args.repeats)
        if "dyck" not in model.name:
            sweep_vs_naive(model, METRICS, args.n_prompts, args.repeats)
            attribution_check(model, exact, args.n_prompts)
    induction_vs_random(args.induction_model, args.n_prompts, args.induction_heads)


if __name__ == "__main__":
    main()
