"""Rich display in Jupyter (``headlens.viz.display``), through a real IPython shell's display formatter.

The planted model's previous-token (L0H0) and induction (L1H0) heads must show in the scores table's grid and
list; the planted circuit's edges in the edge table's graph; any other DataFrame and every ``text/plain`` view
stay exactly what pandas shows.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pandas as pd
import pytest

import headlens
from headlens.circuits.api import circuit
from headlens.testing import planted_circuit_model, planted_model


@pytest.fixture(scope="module")
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    headlens.load_ipython_extension(ip)
    yield ip
    InteractiveShell.clear_instance()


def _views(ip, obj):
    data, _ = ip.display_formatter.format(obj)
    return data["text/plain"], data.get("text/html", "")


def test_scores_table_shows_its_grid_and_labelled_heads(shell):
    table = headlens.classify(planted_model(), detectors=["previous_token", "induction"], n_prompts=10, seq_len=16)
    text, page = _views(shell, table)
    assert text == repr(table)  # print(table) and the text view are pandas' own
    cell = {m.group(1): m.group(2) for m in re.finditer(r'<td title="(L\dH\d)[^"]*"[^>]*>([^<]*)</td>', page)}
    assert cell["L0H0"] == "PT" and cell["L1H0"] == "IND"
    assert {h for h, mark in cell.items() if mark} == {"L0H0", "L1H0"}
    assert "<th>head</th>" in page and "L1H0</td><td>induction" in page


def test_edge_table_shows_its_graph_and_other_frames_are_left_to_pandas(shell):
    edges = circuit(planted_circuit_model(), receivers="L1H0", inputs="qkv", method="zero", n_prompts=8, n_control=3)
    text, page = _views(shell, edges)
    assert text == repr(edges) and "<svg" in page
    assert "L0H0 -&gt; L1H0.k" in page or "L0H0 -> L1H0.k" in page
    other = pd.DataFrame({"a": [1, 2]})
    assert _views(shell, other)[1] == other._repr_html_()


def test_model_card_and_no_ipython_outside_notebooks(shell):
    assert _views(shell, planted_model())[1] == "<code>planted · headlens GPT · 2 layers x 4 heads · d_model 128 · " \
                                                "float32 on cpu</code>"
    code = "import sys, headlens; print('IPython' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_weight_only_labels_are_not_shown_as_behaviour():
    """In Jupyter a table's grid and labelled heads are what heads do on text; a label read from the weights
    (ov_copying, ov_suppression) is one line after them, never a square of the grid."""
    import warnings

    import headlens
    from headlens.testing import vocabulary_model
    from headlens.viz.display import scores_html

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = headlens.classify(vocabulary_model(), detectors="ov_copying,ov_suppression,previous_token")
    page = scores_html(table)
    grid, after = page.split("</table>", 1)
    assert "OVC" not in grid and "OVS" not in grid and "<td>ov_copying</td>" not in after
    assert "not from attention on text: ov_copying L0H0; ov_suppression L0H1" in after
