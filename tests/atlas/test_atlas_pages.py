"""What a head's page teaches: the head card and its disagreement sentence, the offset chart, the sampled
exemplars across deciles, the pairs grouped by class, the readable tokens and the index's clickable scatter."""

from __future__ import annotations

import re
from dataclasses import replace

import pandas as pd
import pytest
import torch

from headlens.atlas.build import build_atlas
from headlens.atlas.exemplars import SAMPLED, AtlasConfig, exemplar_pass, sample_key
from headlens.atlas.site import write_site
from headlens.atlas.views import offset_svg, token_class, token_html
from headlens.scoring.card import head_card
from tests.atlas.planted import planted_gpt, repeat_windows
from tests.conftest import make_gpt


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    model = planted_gpt()
    atlas = build_atlas(model, AtlasConfig(k=5, batch_size=8), windows=repeat_windows(model, 32))
    rows = [dict(model="gpt", layer=layer, head=h, kv_head=h, detector=det, score=s, ci_low=s - 0.01,
                 ci_high=s + 0.01, baseline=0.05, lift=s / 0.05, n_positions=99, n_prompts=8, label=s > 0.5,
                 rest=0.0) for layer in range(2) for h in range(2)
            for det, s in [("induction", 0.9 if (layer, h) == (1, 1) else 0.02),
                           ("previous_token", 0.95 if (layer, h) == (0, 0) else 0.1)]]
    scores = pd.DataFrame(rows)
    scores.attrs["probes"] = {"repeated_segments": {"detectors": ["induction", "previous_token"]}}
    out = tmp_path_factory.mktemp("site")
    write_site(atlas, out, scores)
    return atlas, out, scores


def test_the_index_scatter_links_every_head_to_its_page(site):
    atlas, out, _ = site
    index = (out / "index.html").read_text()
    svg = index[index.index("<svg"):index.index("</svg>")]
    links = re.findall(r"<a href='(heads/L\d+H\d+\.html)' class='pt'>", svg)
    assert sorted(links) == sorted(f"heads/L{d.layer}H{d.head}.html" for d in atlas.descriptions)
    assert all((out / link).is_file() for link in links)


def test_a_head_the_probes_and_the_corpus_disagree_on_says_so_with_both_numbers(site):
    atlas, out, scores = site
    d = next(x for x in atlas.descriptions if (x.layer, x.head) == (1, 1))  # planted to rest; the table says induction
    assert d.role == "resting"
    card = head_card(1, 1, scores, d)
    said = card.disagreement()
    assert said.startswith("The probes and the corpus disagree: induction on repeated segments, 0.90; on prose it rests")
    assert f"it rests, {100 * d.evidence['first']:.0f} % of its attention on the first token" in said
    page = (out / "heads" / "L1H1.html").read_text()
    assert "The probes and the corpus disagree" in page and "induction 0.90 [0.89, 0.91] on repeated segments" in page
    agree = (out / "heads" / "L0H0.html").read_text()  # previous token on both sides: no sentence
    assert "the corpus disagree" not in agree and "previous_token 0.95 [0.94, 0.96] on repeated segments" in agree


def test_the_card_reads_substitution_fields_when_a_description_has_them(site):
    atlas, _, scores = site
    d = atlas.descriptions[2]

    class Later:  # a description after the substitution test: the same fields and more
        def __getattr__(self, name):
            new = {"share_kept": 0.93, "share_ci": (0.9, 0.96), "coverage": 0.4,
                   "mixture": {"induction": 0.7, "previous_token": 0.3}}
            return new[name] if name in new else getattr(d, name)

    card = head_card(d.layer, d.head, scores, Later())
    assert (card.share_kept, card.coverage, card.mixture["induction"]) == (0.93, 0.4, 0.7)


def test_offset_chart_has_axes_numbers_and_a_log_scale_when_one_bar_dwarfs_the_rest(site):
    atlas, _, _ = site
    svg = offset_svg(atlas.exemplars.profile, 0, 0)  # previous token: offset 1 dwarfs the rest
    assert "(log)" in svg and "first token:" in svg and "itself (offset 0):" in svg and "offset q - k" in svg
    assert svg.count("<rect") == 65  # offsets 1 .. 64 and farther


def test_sampled_exemplars_are_a_uniform_reservoir_scored_by_their_attention():
    model = make_gpt(seed=3, attn_only=True, normalization="none")
    gen = torch.Generator().manual_seed(0)
    windows = [torch.cat([torch.tensor([256]), torch.randint(97, 123, (20,), generator=gen)]) for _ in range(9)]
    a = exemplar_pass(model, windows, AtlasConfig(k=4, batch_size=2))
    b = exemplar_pass(model, windows, AtlasConfig(k=4, batch_size=9))
    for head, (got, want) in enumerate(zip(a.top[SAMPLED], b.top[SAMPLED], strict=True)):
        assert [(e.window, e.position) for e in got] == [(e.window, e.position) for e in want]
        keys = sorted((float(sample_key(w, q, head)), w, q) for w in range(9) for q in range(2, 21))[::-1][:4]
        assert sorted((e.window, e.position) for e in got) == sorted((w, q) for _, w, q in keys)
    attn = a.top["attention"]
    for head, kept in enumerate(a.top[SAMPLED]):  # each scored by its strongest off-rest weight, <= the top one
        assert all(0 <= e.score <= attn[head][0].score + 1e-6 for e in kept)


def test_tokens_read_as_words_and_fragments_are_marked():
    assert token_html(" Paris") == "Paris" and "frag" in token_html("usch") and token_html("2") == "2"
    assert [token_class(s) for s in (" the", " Paris", "usch", " 42", ".", "\n")] == [
        "word", "capitalised word", "fragment", "digits", "punctuation", "newline"]


def test_cli_shows_the_classify_table_on_each_page_and_refuses_a_bad_one_in_one_line(monkeypatch, capsys, tmp_path):
    from tests.conftest import run_cli

    code, _, err = run_cli(monkeypatch, capsys, "classify", "--model", "induction-2l", "-o", str(tmp_path / "s.json"))
    assert code == 0, err
    out = tmp_path / "site"
    code, _, err = run_cli(monkeypatch, capsys, "atlas", "--model", "induction-2l", "--out", str(out), "--corpus",
                           "repeats", "--seq-len", "64", "--n-windows", "16", "--k", "3", "--scores",
                           str(tmp_path / "s.json"), "--quiet")
    assert code == 0, err
    page = (out / "heads" / "L1H1.html").read_text()  # the zoo's induction head: probes and corpus agree
    assert "<b>Probes:</b> induction 0." in page and "on repeated segments" in page and "disagree:" not in page
    code, _, err = run_cli(monkeypatch, capsys, "atlas", "--model", "induction-2l", "--out", str(tmp_path / "b"),
                           "--scores", str(tmp_path / "missing.json"))
    assert code != 0 and err.count("\n") == 1 and "missing.json" in err


def test_the_index_says_what_the_descriptions_cost_put_back_together_and_by_layer(site):
    atlas, out, _ = site
    sub = atlas.substitution
    index = (out / "index.html").read_text()
    pct = f"{100 * (sub.all_heads - sub.clean) / sub.clean:+.1f} %"
    assert "The descriptions put back together" in index and f"({pct}, {sub.windows} held-out windows)" in index
    assert "the best-described quarter (" in index and "three quarters" in index
    for la, (n, v) in sub.per_layer.items():  # one row per layer, its two changes and how they were obtained
        row = (f"<tr><th>L{la}</th><td>{n}</td><td>{100 * (v - sub.clean) / sub.clean:+.1f} %</td>"
               f"<td>{100 * (sub.per_layer_mean[la] - sub.clean) / sub.clean:+.1f} %</td>"
               f"<td>{sub.layer_how.get(la, sub.how)}</td></tr>")
        assert row in index


def test_a_resting_head_whose_description_keeps_little_says_why_on_its_page():
    """SmolLM2's L23H6, as measured: 0.70 on the first token, described, and put back it costs about what its mean
    ablation does. The page says where the description falls short; a head whose share is high, or whose removal
    does not move the loss, gets no such sentence."""
    from headlens.atlas.describe import Description
    from headlens.atlas.views import card_html

    ev = {"first": 0.70, "off_rest": 0.27, "share_how": "exact", "abl_lo": 0.0108, "abl_hi": 0.0427,
          "subst_delta": 0.0267}
    d = Description(23, 6, "decay_8", "decay_8", 0.91, (0.89, 0.93), "...", mixture={"first_token": 0.7, "decay_8": 0.3},
                    evidence=ev, share_kept=-0.05, share_ci=(-0.26, 0.11), ablation_delta=0.0253)
    page = card_html(head_card(23, 6, None, d))
    assert "Why it keeps little: 70 % of its attention rests on the first token" in page
    assert "it raises the loss by +0.0267, about what removing it does (+0.0253)" in page
    assert "ablating it changes the loss by +0.0253 [+0.0108, +0.0427]" in page  # the test's own interval
    for other in ({"share_kept": 0.9, "share_ci": (0.8, 1.0)}, {"evidence": {**ev, "abl_lo": -0.001}},
                  {"evidence": {**ev, "first": 0.2}}):
        assert "Why it keeps little" not in card_html(head_card(23, 6, None, replace(d, **other)))
