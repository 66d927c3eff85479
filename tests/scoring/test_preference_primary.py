"""With distractors, preference accuracy (Clark et al. 2019) ranks and labels heads; the mass stays in the table.

Two planted heads on the generated coreference sentences (one referent, one distractor each):
``spread`` puts all of a pronoun's attention on both candidates alike (mass 0.5, preference exactly
chance), ``quiet`` puts a quarter on the referent and the rest on the pronoun itself (mass 0.25,
preference 1). Ranked by mass, ``spread`` came first and ``quiet`` was unlabelled (0.25 < τ = 0.4);
a user asking "which head resolves pronouns?" must get ``quiet``.
"""

from __future__ import annotations

import pytest
import torch

import headlens
from headlens import viz
from headlens.app import helpers as hd
from headlens.probes import coreference as C
from headlens.scoring.primary import primary, strength
from headlens.scoring.stats import PREFERENCE_MARGIN
from headlens.testing import PatternModel, coreference_pattern, uniform_pattern, wordpiece_tokenizer


def _ids(tok, words) -> torch.Tensor:
    return torch.tensor([tok.convert_tokens_to_ids(w.lower()) for w in words])


def spread_pattern(tok):
    pronouns, cands = _ids(tok, C.PRONOUNS.values()), _ids(tok, [*C.MALE, *C.FEMALE, *C.SINGULAR, *C.PLURAL])

    def fn(tokens, valid):
        return (torch.isin(tokens, pronouns)[:, :, None] & torch.isin(tokens, cands)[:, None, :]).float()  # (B, Q, K)

    return fn


def quiet_pattern(tok):
    referent = coreference_pattern(tok)

    def fn(tokens, valid):
        B, T = tokens.shape
        return referent(tokens, valid) + 3 * torch.eye(T).expand(B, T, T)  # (B, Q, K): 1/4 on the referent

    return fn


@pytest.fixture(scope="module")
def table():
    tok = wordpiece_tokenizer()
    model = PatternModel([[spread_pattern(tok), quiet_pattern(tok), uniform_pattern]], causal=False, tokenizer=tok,
                         name="planted")
    return headlens.classify(model, detectors="coreference", n_prompts=64, n_boot=200)


def test_label_rule_uses_preference_and_attention_above_uniform(table):
    by = table.set_index("head")
    assert by.loc[0, "score"] == pytest.approx(0.5, abs=0.03) and by.loc[0, "preference"] == pytest.approx(0.5, abs=0.03)
    assert by.loc[1, "score"] == pytest.approx(0.25, abs=0.03) and by.loc[1, "preference"] == 1.0
    assert by.loc[1, "score"] < table.attrs["thresholds"]["coreference"]  # the mass rule could never label it
    assert by.loc[1, "ci_low"] > by.loc[1, "baseline"] and by.loc[1, "label"]
    assert not by.loc[0, "label"] and not by.loc[2, "label"]  # chance-level preference; uniform attention
    assert "preference ci_low >= chance + 0.5" in table.attrs["preference_rule"] and PREFERENCE_MARGIN == 0.5


def test_ranking_and_strongest_label_use_preference(table):
    assert list(hd.preference_rows(table, "coreference")["head"][:2]) == [1, 0]  # mass would say [0, 1]
    assert list(primary(table.set_index("head"))[:2]) == list(table["preference"][:2])
    assert strength(table.set_index("head"))[1] == pytest.approx(1.0)  # preference 1.0: (1 - 0.5) / (1 - 0.5)
    fig = viz.ranking_figure(table, "coreference")
    assert fig.data[1].y[-1].startswith("L0H1") and "by preference accuracy" in fig.layout.title.text
    assert hd.default_detector(table) == "coreference"
    grid = viz.head_grid_figure(table, "coreference", 1, 3, color_by="label")
    assert grid.data[0].customdata[1][3] == "coreference preference" and grid.data[0].customdata[1][4] == "1.000"
    assert hd.heads_table(table).set_index("head").loc["L0H1", "labels"] == "coreference"


def test_cli_ranking_lists_the_preferred_head_first(table):
    import io

    from rich.console import Console

    from headlens.cli.classify import print_rankings

    out = io.StringIO()
    print_rankings(table, Console(file=out, width=140))
    text = out.getvalue()
    assert "by preference accuracy (1 labelled)" in text
    assert text.index("L0H1") < text.index("L0H0")
