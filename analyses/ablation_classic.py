"""The classic ablation result, reproduced on the zoo models.

``induction-2l``: zero-ablating the induction heads (and, separately, the previous-token heads
that feed them) sharply raises the loss on the repeated half of ``BOS + r + r`` while the
first-half loss barely moves, and random heads of the same layers do not. ``dyck``: ablating
the bracket heads (open_bracket: attention to the opener from the position that predicts its
closer) lowers closing-bracket type accuracy more than random heads do.

Heads are chosen by ``headlens.classify`` (falling back to the zoo model card's
``known_heads``), so the script also checks the labels causally. Writes a tidy CSV table (every
single head plus the labelled groups, with random-head controls, CIs and attribution-patching
estimates) and an HTML figure.

    python analyses/ablation_classic.py [--out artifacts/ablation_classic] [--method zero]
        [--induction-model REF] [--dyck-model REF]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

CASES = {  # model -> (detectors whose labelled heads are ablated as a group, metrics)
    "induction-2l": (("induction", "previous_token"), ("repeated_loss", "first_half_loss")),
    "dyck": (("bracket_matching", "open_bracket"), ("bracket_accuracy",)),
}


def labelled_heads(model: Any, name: str, detectors: tuple[str, ...], n_prompts: int) -> dict[str, list[str]]:
    """``detector -> ["L1H2", ...]``: classify's labels, else the model card's known heads."""
    from headlens.zoo import ZOO

    found: dict[str, list[str]] = {}
    try:
        import headlens

        table = headlens.classify(model, detectors=list(detectors), n_prompts=n_prompts)
        for det in detectors:
            rows = table[(table.detector == det) & table.label]
            found[det] = [f"L{r.layer}H{r.head}" for r in rows.itertuples()]
    except Exception as err:  # classification is another module; the card is a fine fallback
        print(f"  classify unavailable ({err}); using the model card's heads")
    card = ZOO[name].known_heads if name in ZOO else {}
    for det in detectors:
        if not found.get(det) and card.get(det):
            found[det] = list(card[det])
    return {det: heads for det, heads in found.items() if heads}


def run_case(name: str, ref: str, method: str, n_prompts: int, given: dict[str, list[str]]) -> Any:
    """Single-head sweep plus one row per labelled group, for the ``name`` case on model ``ref``.

    ``given`` (detector -> heads) replaces classify's labels for those detectors.
    """
    import pandas as pd

    import headlens
    from headlens.interventions.sweep import sweep

    detectors, metrics = CASES[name]
    model = headlens.load(ref)
    groups = labelled_heads(model, name, detectors, n_prompts)
    groups.update({det: heads for det, heads in given.items() if det in detectors})
    print(f"{name}: heads per label {groups or 'none'}")
    singles = sweep(model, method=method, metrics=metrics, n_prompts=n_prompts, n_control=64)
    print(f"  attribution patching vs exact, Spearman: {singles.attrs['attribution_spearman']}")
    main = singles[singles.metric == metrics[0]]
    worst = main.sort_values("delta", ascending=metrics[0] == "bracket_accuracy").head(3)
    print("  strongest single heads by ablation: " + ", ".join(
        f"{r.heads} {r.delta:+.3f} (random {r.control_delta:+.3f})" for r in worst.itertuples()))
    grouped = (
        sweep(model, groups=[",".join(h) for h in groups.values()], method=method, metrics=metrics,
              n_prompts=n_prompts, n_control=64, n_boot=2000, attribution=False)
        if groups else singles.iloc[:0]
    )
    grouped = grouped.assign(group=[det for det in groups for _ in metrics])
    df = pd.concat([grouped, singles.assign(group="single head")], ignore_index=True)
    return df.assign(model=name)


def effects_for_figure(df: Any) -> Any:
    """Each labelled head (and each labelled group that has a control) next to its random
    same-layer control, as ``viz.ablation_figure`` rows; every single head when none is labelled."""
    import pandas as pd

    rows = []
    labelled = {h for g in df[df.group != "single head"].heads for h in g.split("+")}
    singles = df[(df.group == "single head") & (df.heads.isin(labelled) if labelled else True)]
    groups = df[(df.group != "single head") & df.control_delta.notna() & df.heads.str.contains(r"\+")]
    label_of = {h: g for g, hs in zip(df.group, df.heads, strict=True) if g != "single head" for h in hs.split("+")}
    for r in pd.concat([groups, singles]).itertuples():
        rows.append({"heads": f"{label_of.get(r.heads, r.group)}<br>{r.heads}", "metric": r.metric, "delta": r.delta,
                     "ci_low": r.ci_low, "ci_high": r.ci_high})
        rows.append({"heads": f"random, same layers<br>(for {r.heads})", "metric": r.metric,
                     "delta": r.control_delta, "ci_low": r.control_ci_low, "ci_high": r.control_ci_high})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("artifacts/ablation_classic"))
    parser.add_argument("--method", default="zero", choices=["zero", "mean", "resample"])
    parser.add_argument("--n-prompts", type=int, default=64)
    parser.add_argument("--induction-model", default="induction-2l", help="model for the induction case")
    parser.add_argument("--heads", action="append", default=[],
                        help="DETECTOR=L1H7,... use these heads for a label (repeatable), e.g. induction=L1H7")
    parser.add_argument("--dyck-model", default="dyck", help="model for the bracket case ('none' skips it)")
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))

    import pandas as pd

    from headlens.viz import ablation_figure
    from headlens.zoo import ZOO

    tables, html = [], []
    refs = {"induction-2l": args.induction_model, "dyck": args.dyck_model}
    for name in CASES:
        ref = refs[name]
        if ref.lower() in ("", "none", "skip"):
            continue
        if ref in CASES and (ref not in ZOO or not ZOO[ref].available):
            print(f"{name}: no weights in this checkout; skipped")
            continue
        given = dict(h.split("=", 1) for h in args.heads)
        df = run_case(name, ref, args.method, args.n_prompts, {k: v.split(",") for k, v in given.items()})
        tables.append(df)
        for r in df[df.group != "single head"].itertuples():
            print(f"  {r.group:22s} {r.heads:12s} {r.metric:16s} delta {r.delta:+.3f} [{r.ci_low:+.3f}, "
                  f"{r.ci_high:+.3f}]  random {r.control_delta:+.3f}  excess CI [{r.excess_ci_low:+.3f}, "
                  f"{r.excess_ci_high:+.3f}]  beats random: {r.beats_control}")
        fig = ablation_figure(effects_for_figure(df))
        fig.update_layout(title=dict(text=f"{name}: {args.method} ablation of labelled heads vs random heads "
                                          "of the same layers (95% CI)"), height=420)
        html.append(fig.to_html(full_html=False, include_plotlyjs=not html))
    if not tables:
        return
    args.out.mkdir(parents=True, exist_ok=True)
    pd.concat(tables, ignore_index=True).to_csv(args.out / "ablation_classic.csv", index=False)
    (args.out / "ablation_classic.html").write_text("<html><body>" + "\n".join(html) + "</body></html>")
    print(f"wrote {args.out / 'ablation_classic.csv'} and {args.out / 'ablation_classic.html'}")


if __name__ == "__main__":
    main()
