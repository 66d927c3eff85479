"""The cost curve of benchmarks/scale.py as one SVG (no plotting library: neither kaleido nor matplotlib is
a dependency): memory and time against parameters, float32 solid, bfloat16 dashed.

Run: ``python benchmarks/scale_plot.py rows.json [more.json ...] docs/scale.svg`` (rows from ``scale.py
--json``); prints the table docs/real-models.md shows.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

W, H, PAD = 420, 300, 48  # one panel
COLOURS = {"convert_peak": "#d62728", "classify_peak": "#1f77b4", "weights": "#7f7f7f",
           "convert_s": "#d62728", "classify_s": "#1f77b4", "forwards_s": "#7f7f7f"}
LABELS = {"convert_peak": "first load (convert) peak", "classify_peak": "classify peak", "weights": "weights",
          "convert_s": "first load (convert)", "classify_s": "classify", "forwards_s": "plain forwards"}


def _nice(y: float) -> float:
    """The smallest of 1, 2, 4, 5, 8 x 10^k at or above ``y``: ticks at quarters read as round numbers."""
    k = 10 ** math.floor(math.log10(y))
    return next(m * k for m in (1, 2, 4, 5, 8, 10) if m * k >= y)


def _panel(rows: list[dict[str, Any]], keys: tuple[str, ...], scale: float, unit: str, x0: int) -> list[str]:
    xs = [r["params"] / 1e9 for r in rows]
    ys = [r[k] / scale for r in rows for k in keys]
    x_max, y_max = max(xs) * 1.05, _nice(max(ys) * 1.05)

    def px(x: float, y: float) -> tuple[float, float]:
        return x0 + PAD + x / x_max * (W - 2 * PAD), H - PAD - y / y_max * (H - 2 * PAD)

    out = [f'<rect x="{x0 + PAD}" y="{PAD}" width="{W - 2 * PAD}" height="{H - 2 * PAD}" fill="none" stroke="#ccc"/>',
           f'<text x="{x0 + W / 2}" y="{H - 10}" text-anchor="middle">parameters (billions)</text>',
           f'<text x="{x0 + 12}" y="{PAD - 12}">{unit}</text>']
    for i in range(5):
        y = y_max * i / 4
        _, py = px(0, y)
        out.append(f'<text x="{x0 + PAD - 6}" y="{py + 4:.0f}" text-anchor="end">{y:.3g}</text>')
    last = -1e9
    for x in sorted(set(xs)):
        qx, _ = px(x, 0)
        if qx - last < 30:  # labels would overlap
            continue
        last = qx
        out.append(f'<text x="{qx:.0f}" y="{H - PAD + 16}" text-anchor="middle">{x:.2g}</text>')
    for j, key in enumerate(keys):
        for dtype, dash in (("float32", ""), ("bfloat16", ' stroke-dasharray="6 4"')):
            pts = [px(r["params"] / 1e9, r[key] / scale) for r in rows if r["dtype"] == dtype]
            if pts:
                line = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)
                out.append(f'<polyline points="{line}" fill="none" stroke="{COLOURS[key]}" stroke-width="2"{dash}/>')
                out += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{COLOURS[key]}"/>' for a, b in pts]
        out.append(f'<text x="{x0 + PAD + 8}" y="{PAD + 16 + 16 * j}" fill="{COLOURS[key]}">{LABELS[key]}</text>')
    return out


def draw(rows: list[dict[str, Any]]) -> str:
    """Two panels: GB against parameters, seconds against parameters; solid float32, dashed bfloat16."""
    body = _panel(rows, ("convert_peak", "classify_peak", "weights"), 1e9, "GB (peak RSS)", 0)
    body += _panel(rows, ("convert_s", "classify_s", "forwards_s"), 1.0, "seconds (wall)", W)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{H + 20}" '
            f'font-family="sans-serif" font-size="11"><rect width="100%" height="100%" fill="white"/>'
            + "".join(body)
            + f'<text x="{W}" y="{H + 12}" text-anchor="middle">solid: float32, dashed: bfloat16</text></svg>\n')


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as the table docs/real-models.md shows."""
    out = ["| size | dtype | weights | first load: wall, peak (bound) | load | classify vs plain forwards | "
           "classify peak / (weights + batch) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        wb = r["weights"] + r["activations"]
        out.append(f"| {r['size']} ({r['params'] / 1e9:.2f}B) | {r['dtype']} | {r['weights'] / 1e9:.2f} GB | "
                   f"{r['convert_s']:.0f} s, {r['convert_peak'] / 1e9:.2f} GB ({r['convert_bound'] / 1e9:.2f}) | "
                   f"{r['load_s']:.1f} s | {r['classify_s']:.1f} s / {r['forwards_s']:.1f} s = "
                   f"{r['classify_s'] / r['forwards_s']:.2f}x | {r['classify_peak'] / 1e9:.2f} / {wb / 1e9:.2f} GB = "
                   f"{r['classify_peak'] / wb:.2f}x |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    rows = [row for name in sys.argv[1:-1] for row in json.loads(Path(name).read_text())]
    Path(sys.argv[-1]).write_text(draw(rows))
    print(markdown(rows))
