"""induction-2l's circuit for repeated_loss: discovery, the edge table and the graph (docs/circuits.md).

    PYTHONPATH=. python analyses/circuit_induction2l.py --out /tmp/circuit_induction2l.html
    chromium --headless --no-sandbox --hide-scrollbars --window-size=1000,520 \
        --screenshot=docs/circuit_induction2l.png /tmp/circuit_induction2l.html

Writes the edge table next to the figure (``.csv``) and prints it with the motifs. Single thread, about
2 s. (No kaleido here, so the PNG is a headless-chromium screenshot of the HTML figure.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import headlens
from headlens.circuits.motifs import motifs
from headlens.viz import circuit_figure, figure_html

LABELS = {"L0H0": "previous_token", "L1H1": "induction"}  # the card's classify labels (L1H1: 0.329 induction)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/circuit_induction2l.html"))
    parser.add_argument("--method", default="zero")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = headlens.load("induction-2l")
    df = headlens.circuit(model, method=args.method, n_prompts=32, labels=LABELS)
    heads = df[df.sender.str.startswith("L") & df.receiver.str.startswith("L")]
    fig = circuit_figure(heads, model.n_layers, model.n_heads, LABELS,
                         title=f"induction-2l: head-to-head edges for repeated_loss ({args.method} ablation, "
                               f"faithfulness {df.attrs['faithfulness']:.2f})")
    fig.update_layout(width=1000, height=500)
    args.out.write_text(figure_html(fig))
    df.to_csv(args.out.with_suffix(".csv"), index=False)
    print(df.drop(columns=["model"]).round(3).to_string())
    print(motifs(df, LABELS).round(3).to_string())
    print("faithfulness curve:", [round(x, 3) for x in df.attrs["faithfulness_curve"]])


if __name__ == "__main__":
    main()
