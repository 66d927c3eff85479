"""The report's direct logit attribution section: who writes a prediction (bars and the strongest writers and
suppressors with CIs), and, when the name movers were scored, the IOI answer's writers and the DLA column."""

from __future__ import annotations

import headlens
from headlens.scoring.classification import classify
from headlens.scoring.writers import attribution_summary, strongest
from headlens.testing import planted_model
from headlens.viz.report import report_html
from tests.conftest import run_cli
from tests.ioi_models import save_planted_llama


def test_section_lists_the_strongest_writers_with_their_cis():
    model = planted_model()
    table = classify(model, n_prompts=12, seq_len=32)
    dla = headlens.attribute(model, ["abcdabcd", "abcabcab", "ghijghij"], target="d", position=3)
    page = report_html(model, table, prompt="abcdabcd", attribution=dla)
    assert "<h2>Who writes the prediction</h2>" in page and "over 3 prompt(s)" in page
    writers, suppressors = strongest(attribution_summary(dla), 10)
    for r in [*writers.itertuples(), *suppressors.itertuples()]:
        assert f"<td>{r.component}</td><td>{r.attribution:+.3f}</td>" in page
    assert page.count("Plotly.newPlot") == 2 + page.count('class="head"')  # the grid and the bars
    assert "Who writes" not in report_html(model, table, prompt="abcdabcd")


def test_classify_report_with_name_movers(tmp_path, monkeypatch, capsys):
    path = save_planted_llama(tmp_path / "m", {(1, 0): (12, 4.0)})
    out = tmp_path / "r.html"
    code, _, err = run_cli(monkeypatch, capsys, "classify", "--model", f"hf:{path}", "--detectors",
                           "name_mover,negative_name_mover", "--n-prompts", "8", "-q", "--report", str(out))
    assert code == 0, err
    page = out.read_text()
    assert "Direct logit attribution to IO - S over 8 prompt(s)" in page
    assert "<th>DLA (95% CI)</th>" in page or "No head passes" in page
