"""``headlens classify --report``: one standalone HTML page (plotly.js inlined) with the grid, the labelled
heads and their CIs, each labelled head's pattern on an example prompt, and the provenance."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from headlens.cli import app
from headlens.models.checkpoint import save_checkpoint
from headlens.scoring.classification import classify
from headlens.scoring.table import labelled_heads
from headlens.testing import planted_model
from headlens.viz.report import report_html, write_report

runner = CliRunner()


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    model = planted_model()
    return model, str(save_checkpoint(model, tmp_path_factory.mktemp("m") / "planted.safetensors"))


def test_report_holds_grid_labelled_heads_patterns_and_provenance(planted, tmp_path):
    model, _ = planted
    table = classify(model, n_prompts=12, seq_len=32)
    page = write_report(model, table, tmp_path / "r.html", prompt="abcdabcd").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<html") == 1
    # offline: plotly.js inlined exactly once, no script fetched from anywhere
    assert page.count("* plotly.js v") == 1 and page.count("Plotly.newPlot") == 1 + page.count('class="head"')
    assert not re.search(r"<script[^>]+src=", page)
    labelled = labelled_heads(table)
    assert len(labelled) >= 2
    for r in labelled.itertuples():  # every labelled head with its CI
        assert f"<td>L{r.layer}H{r.head}</td><td>{r.detector}</td><td>{r.score:.3f}</td>" in page
        assert f"[{r.ci_low:.3f}, {r.ci_high:.3f}]" in page
    heads = {(int(r.layer), int(r.head)) for r in labelled.itertuples()}
    assert page.count('class="head"') == len(heads)  # one pattern section per labelled head
    assert page.count('class="hl-head"') == len(heads)  # each with its coloured-text view
    assert '"n_prompts": 12' in page and "headlens_version" in page  # provenance


def test_classify_report_flag_writes_the_page_and_refuses_a_bad_path(planted, tmp_path):
    _, ckpt = planted
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["classify", "--model", ckpt, "--n-prompts", "8", "--seq-len", "32", "--quiet",
                                 "--report", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text().count('class="head"') >= 1
    bad = runner.invoke(app, ["classify", "--model", ckpt, "--report", str(tmp_path / "r.pdf")])
    assert bad.exit_code == 7 and "must end in .html" in bad.stderr and "Traceback" not in bad.output
    missing = runner.invoke(app, ["classify", "--model", ckpt, "--report", str(tmp_path / "no" / "r.html")])
    assert missing.exit_code == 7 and "does not exist" in missing.stderr


def test_a_model_without_labels_still_gets_a_page(planted):
    model, _ = planted
    table = classify(model, n_prompts=8, seq_len=32).assign(label=False)
    page = report_html(model, table, prompt="abcd")
    assert "No head passes the labelling rule" in page and 'class="head"' not in page


def test_report_with_edges_has_the_circuit_graph_and_table(tmp_path):
    from headlens.circuits.api import circuit
    from headlens.testing import PLANTED_EDGES, planted_circuit_model

    model = planted_circuit_model()
    table = classify(model, n_prompts=12, seq_len=32)
    edges = circuit(model, receivers="L1H0", n_prompts=8, n_control=3, labels=table)
    page = write_report(model, table, tmp_path / "r.html", prompt="abcdabcd", edges=edges).read_text()
    assert "<h2>Circuit</h2>" in page and "significant edges for repeated_loss (3 of" in page
    for sender, receiver, c in PLANTED_EDGES:
        assert f"<td>{sender}</td><td>{receiver}</td><td>0</td><td>{c}</td>" in page
    assert "previous_token -&gt; induction" in page  # the label column joins classify's labels
    assert page.count("* plotly.js v") == 1


def test_report_shows_what_the_vocabulary_heads_write():
    from headlens.testing import vocabulary_model

    model = vocabulary_model()
    table = classify(model, detectors="ov_copying,ov_suppression,successor")
    page = report_html(model, table)
    section = page[page.index("<h2>Vocabulary heads</h2>"):page.index("<h2>Provenance</h2>")]
    for head, det in (("L0H0", "ov_copying"), ("L0H1", "ov_suppression"), ("L0H2", "successor")):
        assert f"<td>{head}</td><td>{det}</td><td>1.000</td>" in section
    assert "a → b " in section and "3 → 4 " in section  # the successor head writes the next item first
    assert "Succession per list" in section and "<th>letters_lower</th>" in section
    before = page[:page.index("<h2>Vocabulary heads</h2>")]  # weight-only types are not shown as behaviour
    assert not any(f"<td>{det}</td>" in before or f"{det}:" in before for det in ("ov_copying", "ov_suppression"))
    assert "Read from the weights, not from attention on text" in before


def test_report_opens_with_the_summary_and_orders_resting_last():
    from headlens.testing import resting_model

    model = resting_model()
    table = classify(model, n_prompts=12, seq_len=32, n_boot=100)
    page = report_html(model, table, prompt="abcdabcd")
    summary = page.split("<h2>What the heads do</h2>")[1].split("<h2>")[0]
    assert "<td>induction</td><td>1</td><td>L1H0 0.500 (strength " in summary  # the head that rests and does induction
    assert "<td>first_token</td><td>2 (1 rest and do nothing else)</td><td>L1H1 1.000 (strength 1.00, rest 1.00)" in summary
    labelled = page.split("<h2>Labelled heads</h2>")[1].split("<h2>")[0]
    assert labelled.index("<td>L1H0</td><td>induction</td>") < labelled.index("<td>L1H0</td><td>first_token</td>")
    assert "<h3>L1H0: induction, first_token</h3>" in page  # its pattern, strongest label first
