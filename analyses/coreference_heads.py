"""Coreference heads in all-MiniLM-L6-v2: the census, and a causal check by ablation.

1. **Census**: ``headlens.classify(minilm, detectors="coreference")`` on templated sentences
   (``headlens.probes.coreference``: gender and number, the referent first or second at random).
   Writes the scores table and the ranking figure (score and preference accuracy with 95 % CIs).
2. **Causal check**: on *held-out* sentences (another seed), zero-ablate the top-k heads by
   preference accuracy (the primary statistic of a head type with distractors, Clark et al. 2019;
   ties by mass), and k random heads (other sets of the same size, excluding the top
   heads), and measure how far the model still resolves the pronoun
   (``headlens.interventions.metrics.coreference_margins``): the sentence-embedding margin
   ``cos(s, "Mary needed help.") - cos(s, "John needed help.")`` and the token-level margin of
   the pronoun's final vector. A drop = clean - ablated (positive: the ablation hurt
   resolution); 95 % CIs bootstrap the sentences. Writes a CSV and a figure.
3. **By kind**: the census split into gender and number sentences (the same rows passed to
   ``headlens.classify(prompts=[...])`` as two user-defined annotated head types).

    python analyses/coreference_heads.py [--out artifacts/coreference] [--n-score 200]
        [--n-test 96] [--k 1,3] [--n-random 8] [--method zero|mean] [--png docs/coreference_minilm.png]
        [--ablation-png docs/coreference_ablation.png]

PNG figures are rendered by Debian's chromium through Playwright (no kaleido needed);
``--png`` also writes the README's figure.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch


def png(fig: Any, path: Path, width: int = 1000) -> None:
    """Render a plotly figure to PNG with headless chromium (``$HEADLENS_CHROMIUM`` or /usr/bin/chromium)."""
    from playwright.sync_api import sync_playwright

    from headlens.viz import figure_html

    html = path.with_suffix(".tmp.html")
    html.write_text(figure_html(fig), encoding="utf-8")
    height = int(fig.layout.height or 500)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=os.environ.get("HEADLENS_CHROMIUM", "/usr/bin/chromium"),
                                         args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": width, "height": height + 20}, device_scale_factor=2)
            page.goto(html.resolve().as_uri())
            page.wait_for_selector(".main-svg")
            page.locator(".plotly-graph-div").first.screenshot(path=str(path))
            browser.close()
    finally:
        html.unlink(missing_ok=True)


def by_kind(model: Any, n: int, seed: int) -> Any:
    """The census split by sentence kind, through the annotated-prompts API: the same generated
    rows, renamed ``coreference_gender`` / ``coreference_number``, passed as dicts."""
    import pandas as pd

    import headlens
    from headlens.probes import coreference as C

    rows = [dict(ex.row(), detector=f"coreference_{ex.kind}") for ex in C.examples(model, n, seed=seed)]
    table = headlens.classify(model, prompts=rows, detectors="coreference_gender,coreference_number", seed=seed)
    cols = ["detector", "layer", "head", "score", "ci_low", "ci_high", "preference", "preference_ci_low",
            "preference_ci_high", "label"]
    from headlens.scoring.primary import ranked

    return pd.concat([ranked(table, d).head(6) for d in sorted(set(table["detector"]))])[cols]


def _subsets(examples: list[Any]) -> dict[str, torch.Tensor]:
    kinds = [e.kind for e in examples]
    out = {"all": torch.ones(len(kinds), dtype=torch.bool)}
    out.update({k: torch.tensor([x == k for x in kinds]) for k in sorted(set(kinds))})
    return out


def drops(clean: dict[str, torch.Tensor], ablated: dict[str, torch.Tensor], heads: str, kind: str,
          subsets: dict[str, torch.Tensor]) -> list[dict]:
    """One row per metric and sentence subset: mean drop (clean - ablated) with its 95 % CI."""
    from headlens.interventions.metrics import bootstrap_ci

    out = []
    for metric, c in clean.items():
        for name, sel in subsets.items():
            d = (c - ablated[metric])[sel].numpy()
            lo, hi = bootstrap_ci(d)
            a = ablated[metric][sel]
            out.append({"heads": heads, "kind": kind, "sentences": name, "metric": metric, "drop": float(d.mean()),
                        "ci_low": lo, "ci_high": hi, "ablated_mean": float(a.mean()),
                        "ablated_correct": float((a > 0).double().mean())})
    return out


def causal_check(model: Any, table: Any, n_test: int, ks: list[int], n_random: int, seed: int,
                 method: str = "zero") -> Any:
    import pandas as pd

    import headlens
    from headlens.interventions.metrics import bootstrap_ci, coreference_margins
    from headlens.probes import coreference as C

    examples = C.examples(model, n_test, seed=seed + 1)  # held out: not the census sentences
    subsets = _subsets(examples)
    reference = None if method == "zero" else [e.text for e in examples]  # mean: over these sentences
    clean = coreference_margins(model, examples)
    rows = [{"heads": "none (clean)", "kind": "clean", "sentences": name, "metric": m, "drop": 0.0, "ci_low": 0.0,
             "ci_high": 0.0, "ablated_mean": float(v[sel].mean()), "ablated_correct": float((v[sel] > 0).double().mean())}
            for m, v in clean.items() for name, sel in subsets.items()]
    from headlens.scoring.primary import ranked

    order = [f"L{r.layer}H{r.head}" for r in ranked(table, "coreference").itertuples()]
    gen = torch.Generator().manual_seed(seed)
    for k in ks:
        top = order[:k]
        with headlens.ablate(model, ",".join(top), method=method, reference=reference):
            rows += drops(clean, coreference_margins(model, examples), "+".join(top), f"top-{k}", subsets)
        pool = order[k:]
        per_set = {m: [] for m in clean}
        for _ in range(n_random):
            pick = [pool[i] for i in torch.randperm(len(pool), generator=gen)[:k].tolist()]
            with headlens.ablate(model, ",".join(pick), method=method, reference=reference):
                ablated = coreference_margins(model, examples)
            rows += drops(clean, ablated, "+".join(pick), f"random-{k}", subsets)
            for m in clean:
                per_set[m].append(clean[m] - ablated[m])
        for m in clean:  # random heads pooled: per sentence, the mean drop over the random sets
            d_all = torch.stack(per_set[m]).mean(0)
            for name, sel in subsets.items():
                d = d_all[sel].numpy()
                lo, hi = bootstrap_ci(d)
                rows.append({"heads": f"{n_random} random sets", "kind": f"random-{k} (pooled)", "sentences": name,
                             "metric": m, "drop": float(d.mean()), "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows)


def effects_figure(effects: Any, method: str = "zero", n_random: int = 8) -> Any:
    """Drop of each margin for the top-k heads and pooled random k heads, grouped by sentence kind."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    if "sentences" not in effects:
        effects = effects.assign(sentences="all")
    shown = effects[effects["kind"].str.startswith("top") | effects["kind"].str.endswith("(pooled)")]
    metrics = list(dict.fromkeys(shown["metric"]))
    colors = {"all": "#3b6fb6", "gender": "#e07b39", "number": "#2e8b57"}
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=[f"{m} margin: drop when ablated" for m in metrics])
    for c, m in enumerate(metrics, 1):
        for subset, r in shown[shown["metric"] == m].groupby("sentences", sort=False):
            fig.add_trace(go.Bar(
                x=[k.replace(" (pooled)", "") for k in r["kind"]], y=r["drop"], hovertext=r["heads"],
                name=f"{subset} sentences", legendgroup=subset, showlegend=c == 1,
                marker_color=colors.get(subset, "#999999"),
                error_y=dict(type="data", symmetric=False, array=r["ci_high"] - r["drop"],
                             arrayminus=r["drop"] - r["ci_low"])), row=1, col=c)
        fig.update_yaxes(title_text="clean - ablated (95% CI)" if c == 1 else None, row=1, col=c)
    top = shown[shown["kind"].str.startswith("top")]["heads"]
    biggest = max(top, key=len) if len(top) else ""
    fig.update_layout(height=430, barmode="group", margin=dict(l=60, r=20, t=100, b=80),
                      legend=dict(orientation="h", y=1.2, x=1, xanchor="right"),
                      title=dict(text=f"MiniLM: {method}-ablating the top coreference heads vs random heads", x=0.01))
    fig.add_annotation(text=f"top heads by preference accuracy: {biggest.replace('+', ', ')}; random: pooled over "
                            f"{n_random} sets of the "
                            f"same size; positive = ablation hurt resolution", xref="paper", yref="paper", x=0,
                       y=-0.2, showarrow=False, xanchor="left", font=dict(size=11))
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("artifacts/coreference"))
    ap.add_argument("--n-score", type=int, default=200, help="census sentences")
    ap.add_argument("--n-test", type=int, default=96, help="held-out sentences for the causal check")
    ap.add_argument("--k", default="1,3", help="sizes of the ablated top-head groups")
    ap.add_argument("--n-random", type=int, default=8, help="random head sets per size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--method", default="zero", choices=("zero", "mean"), help="how heads are ablated")
    ap.add_argument("--png", type=Path, default=None, help="also write the ranking figure here (docs)")
    ap.add_argument("--ablation-png", type=Path, default=None, help="also write the ablation figure here (docs)")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("HEADLENS_THREADS", "1")))

    import headlens
    from headlens.scoring.table import write_table
    from headlens.viz import figure_html, ranking_figure

    args.out.mkdir(parents=True, exist_ok=True)
    model = headlens.load("minilm")
    table = headlens.classify(model, detectors="coreference", n_prompts=args.n_score, seed=args.seed)
    write_table(table, args.out / "coreference_scores.csv")
    fig = ranking_figure(table, "coreference")
    (args.out / "coreference_ranking.html").write_text(figure_html(fig), encoding="utf-8")
    for path in [args.out / "coreference_ranking.png", *([args.png] if args.png else [])]:
        png(fig, path)
    cols = ["layer", "head", "score", "ci_low", "ci_high", "lift", "label", "preference", "preference_ci_low",
            "preference_ci_high"]
    from headlens.scoring.primary import ranked

    print(ranked(table, "coreference")[cols].head(8).to_string(index=False))
    print("labelled:", int(table["label"].sum()))
    kinds = by_kind(model, args.n_score, args.seed)
    kinds.to_csv(args.out / "coreference_by_kind.csv", index=False)
    print(kinds.to_string(index=False))
    effects = causal_check(model, table, args.n_test, [int(k) for k in args.k.split(",")], args.n_random, args.seed,
                           args.method)
    effects.to_csv(args.out / "coreference_ablation.csv", index=False)
    fig = effects_figure(effects, args.method, args.n_random)
    (args.out / "coreference_ablation.html").write_text(figure_html(fig), encoding="utf-8")
    for path in [args.out / "coreference_ablation.png", *([args.ablation_png] if args.ablation_png else [])]:
        png(fig, path)
    print(effects[~effects["kind"].str.match(r"random-\d+$")].to_string(index=False))


if __name__ == "__main__":
    main()
