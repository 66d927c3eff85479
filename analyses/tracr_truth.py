"""Circuit discovery against compiled ground truth: tracr programs and the edges of their RASP graphs.

Each RASP program is compiled by tracr, converted exactly to a headlens GPT (its argmax equals tracr's
output on every check prompt) and its true edges are read off the RASP graph
(:mod:`headlens.circuits.tracr`). Then, under mean, resample and zero ablation (only zero also moves what
senders write about positions), with ``kl`` of the program's output as the metric:

* **ROC AUC**: every candidate edge (embedding, the program's heads and MLPs -> its heads' q/k/v and the
  logits) is patched exactly and ranked by ``|effect|``; the AUC is the chance a true edge outranks a
  false one. ``untested_true`` counts the true edges the ablation could not test: the patch left the
  receiver's input exactly as it was (:func:`headlens.circuits.tracr.input_change`).
* **Discovery**: ``headlens.circuit`` with no receivers; its edges against the true edges into heads.

Needs the optional extra (``pip install -e '.[tracr]'``: tracr-pypi and jax). Runs in about 25 s.

    python analyses/tracr_truth.py [--out artifacts/tracr_truth] [--n-prompts 32] [--seed 0]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

METHODS = ("mean", "resample", "zero")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="artifacts/tracr_truth", help="folder for edges.csv and summary.md")
    ap.add_argument("--n-prompts", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import pandas as pd

    import headlens
    from headlens.circuits.tracr import edge_scores, programs, roc_auc

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, tables = [], []
    for name, make in programs().items():
        t0 = time.perf_counter()
        c = make()
        compiled_s = time.perf_counter() - t0
        into_heads = {t for t in c.truth if t[1] != "logits"}
        for method in METHODS:
            df = edge_scores(c, method, n_prompts=args.n_prompts, seed=args.seed)
            df.insert(0, "program", name)
            df.insert(1, "ablation", method)
            tables.append(df)
            found = headlens.circuit(c.model, metric="kl", method=method, prompts=c.prompts(args.n_prompts, args.seed),
                                     n_prompts=args.n_prompts, seed=args.seed, n_boot=200)
            got = {(r.sender, r.receiver, r.input) for r in found.itertuples()}
            rows.append({
                "program": name, "method": method, "layers": c.model.cfg.n_layers, "heads": ",".join(c.heads),
                "candidates": len(df), "true": int(df.true.sum()),
                "auc": roc_auc(df.effect.abs(), df.true),
                "untested_true": int((df.true & ~df.tested).sum()),
                "discovered": len(got), "discovered_true": len(got & into_heads),
                "discovered_false": len(got - into_heads), "true_into_heads": len(into_heads),
                "faithfulness": found.attrs.get("faithfulness", float("nan")), "compile_s": round(compiled_s, 1),
            })
            missed = sorted(into_heads - got)
            print(f"{name:9s} {method:8s} AUC {rows[-1]['auc']:.3f} ({rows[-1]['untested_true']} true edges untested); "
                  f"discovery {len(got & into_heads)}/{len(into_heads)} true, {len(got - into_heads)} false; "
                  f"missed {missed}")
    summary = pd.DataFrame(rows)
    pd.concat(tables, ignore_index=True).to_csv(out / "edges.csv", index=False)
    (out / "summary.md").write_text(summary.to_markdown(index=False, floatfmt=".3f") + "\n")
    print(summary.to_string(index=False))
    print(f"wrote {out / 'edges.csv'} and {out / 'summary.md'}")


if __name__ == "__main__":
    main()
