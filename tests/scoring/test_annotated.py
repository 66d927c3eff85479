"""Annotated prompts: spans map to the right tokens under byte, char, WordPiece and BPE tokenizers;
planted heads get exactly known scores; every bad annotation is one clear line."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

import headlens
from headlens import viz
from headlens.cli import app
from headlens.errors import ProbeError
from headlens.models.tokenizer import Tokenizer
from headlens.probes import coreference as C
from headlens.probes.spans import annotated_probe, body_offsets, check_row, span_tokens
from headlens.scoring.table import read_table
from headlens.testing import (
    PatternModel,
    coreference_pattern,
    first_candidate_pattern,
    offset_pattern,
    uniform_pattern,
    wordpiece_tokenizer,
)

TEXT = "John told Mary that she was late."


def _tokens(model, text, span):
    _, offsets = body_offsets(model, text)
    hit, aligned = span_tokens(text, offsets, span)
    return [text[slice(*offsets[i])] for i in hit], aligned


def test_byte_and_char_spans():
    byte = SimpleNamespace(tokenizer=Tokenizer.byte_level())
    assert _tokens(byte, TEXT, (10, 14)) == (list("Mary"), True)
    # a two-byte character is two tokens, both in the span, and the span is still aligned
    ids, offsets = body_offsets(byte, "née x")
    assert len(ids) == 6 and span_tokens("née x", offsets, (1, 2)) == ([1, 2], True)
    char = SimpleNamespace(tokenizer=Tokenizer.char_level("abc "))
    assert _tokens(char, "ab cab", (3, 5)) == (["c", "a"], True)


@pytest.fixture(scope="module")
def wordpiece():
    return SimpleNamespace(tokenizer=wordpiece_tokenizer())


def test_wordpiece_spans(wordpiece):
    assert _tokens(wordpiece, TEXT, (20, 23)) == (["she"], True)
    assert _tokens(wordpiece, TEXT, (10, 14)) == (["Mary"], True)
    # "Mary that" across two tokens; "ar" inside one: takes the token it overlaps, not aligned
    assert _tokens(wordpiece, TEXT, (10, 19)) == (["Mary", "that"], True)
    assert _tokens(wordpiece, TEXT, (11, 13)) == (["Mary"], False)
    # a word split into word pieces: all its pieces
    assert _tokens(wordpiece, "a zyx b", (2, 5)) == (["z", "y", "x"], True)


@pytest.fixture(scope="module")
def bpe():
    """A GPT-2-style byte-level BPE, trained in a second on the coreference templates."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    words = {"male": C.MALE, "female": C.FEMALE, "singular": C.SINGULAR, "plural": C.PLURAL}
    gen = torch.Generator().manual_seed(0)
    texts = [C.example(k, words, gen).text for _ in range(300) for k in ("gender", "number")]
    tok.train_from_iterator(texts + [TEXT] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    return SimpleNamespace(tokenizer=fast)


def test_bpe_spans_ignore_the_space_a_token_carries(bpe):
    ids, offsets = body_offsets(bpe, TEXT)
    hit, aligned = span_tokens(TEXT, offsets, (10, 14))  # "Mary": BPE's token is " Mary"
    assert [bpe.tokenizer.convert_ids_to_tokens(ids[i]) for i in hit] == ["ĠMary"] and aligned
    assert span_tokens(TEXT, offsets, (11, 13)) == (hit, False)


def test_planted_coreference_head_scores_one_and_a_position_head_does_not():
    tok = wordpiece_tokenizer()
    heads = [coreference_pattern(tok), first_candidate_pattern(tok), offset_pattern(-1), uniform_pattern]
    for causal in (False, True):
        model = PatternModel([heads], causal=causal, tokenizer=tok, name="planted-coref")
        assert C.kinds(model) == ["gender", "number"]
        df = headlens.classify(model, detectors="coreference", n_prompts=64, n_boot=200).set_index("head")
        assert df.loc[0, "score"] == pytest.approx(1.0) and df.loc[0, "preference"] == 1.0 and df.loc[0, "label"]
        # the first candidate is the referent half the time: mass ~0.5, preference at chance, no label
        assert 0.3 < df.loc[1, "score"] < 0.7 and df.loc[1, "preference_ci_low"] < 0.5 < df.loc[1, "preference_ci_high"]
        assert not df.loc[1:, "label"].any()
        assert df.loc[3, "score"] == pytest.approx(df.loc[3, "baseline"])  # uniform = the baseline
        assert df.loc[3, "preference"] == pytest.approx(0.5)  # ties split: exactly chance


def test_query_span_rows_are_averaged_and_distractors_from_the_same_query():
    model = PatternModel([[offset_pattern(-1), uniform_pattern]], causal=True)  # char-level 'a'..'p'
    rows = [{"text": "abcdef", "targets": [{"query": [3, 5], "keys": [[2, 4]]}], "distractors": [[0, 1]]}]
    with pytest.warns(UserWarning, match="fewer than 10 prompts"):
        df = headlens.classify(model, prompts=rows, detectors="annotated", n_boot=50).set_index("head")
    # query rows d, e (positions 4, 5 after BOS) -> keys c, d (3, 4): d's previous is c (hit), e's is d (hit)
    assert df.loc[0, "score"] == pytest.approx(1.0) and df.loc[0, "preference"] == 1.0
    # uniform: row 4 sees 5 keys, 2 of them targets; row 5 sees 6 -> mean(2/5, 2/6)
    assert df.loc[1, "score"] == pytest.approx((2 / 5 + 2 / 6) / 2) == df.loc[1, "baseline"]
    assert df.loc[1, "detector"] == "annotated" and df.loc[1, "n_positions"] == 1


BAD = [
    ({"text": "abc", "targets": [{"query": [0, 9], "keys": [[1, 2]]}]}, "query [0, 9] is out of range"),
    ({"text": "abc", "targets": [{"query": [0, 1], "keys": []}]}, "keys is empty"),
    ({"text": "abc", "targets": [{"query": [0, 1], "keys": [[1, 2]]}], "label": 1}, "unknown field(s) ['label']"),
    ({"text": "abc", "targets": [{"query": [0, 1], "key": [[1, 2]]}]}, "unknown field(s) ['key']"),
    ({"text": "abc", "targets": [{"query": "a", "keys": [[1, 2]]}]}, "expected [start, end]"),
    ({"text": "abc", "targets": []}, '"targets" is []'),
    ({"text": "abc", "targets": [{"query": [0, 1], "keys": [[1, 2]]}], "distractors": [[2, 2]]}, "out of range"),
]


@pytest.mark.parametrize(("row", "message"), BAD)
def test_bad_annotations_are_one_line(row, message):
    with pytest.raises(ProbeError) as err:
        check_row(row, 0)
    assert message in str(err.value) and "\n" not in str(err.value) and str(err.value).startswith("prompt 1")


def test_spans_that_cannot_be_scored():
    model = PatternModel([[uniform_pattern]], causal=True, tokenizer=Tokenizer.char_level("ab "))
    with pytest.raises(ProbeError, match="every key lies after the query"):
        annotated_probe(model, [(0, {"text": "ab ab", "targets": [{"query": [0, 1], "keys": [[3, 4]]}]})], "x")
    wp = PatternModel([[uniform_pattern]], causal=False, tokenizer=wordpiece_tokenizer())
    with pytest.raises(ProbeError, match=r"\[4, 5\] \(' '\) covers no token"):
        annotated_probe(wp, [(0, {"text": "john mary", "targets": [{"query": [0, 4], "keys": [[4, 5]]}]})], "x")
    with pytest.raises(ProbeError, match="is a built-in detector"):
        headlens.classify(model, prompts=[{"text": "ab", "detector": "induction",
                                           "targets": [{"query": [1, 2], "keys": [[0, 1]]}]}])


def test_tokenizer_that_splits_names_is_refused_in_one_line():
    byte_model = PatternModel([[uniform_pattern]], tokenizer=Tokenizer.byte_level())
    why = C.unsupported(byte_model)
    assert why and "single tokens" in why and "'she' -> ['s', 'h', 'e']" in why
    with pytest.raises(ProbeError, match="single tokens"):
        headlens.classify(byte_model, detectors="coreference")
    assert "coreference" in headlens.classify(byte_model, n_prompts=10).attrs["skipped"]


def test_cli_annotated_jsonl(tmp_path, monkeypatch):
    model = PatternModel([[offset_pattern(-1), uniform_pattern]], causal=True)
    monkeypatch.setattr("headlens.scoring.classification.resolve_model", lambda ref, device="cpu", **kw: model)
    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(json.dumps({"text": "abcdef"[:n], "detector": "prev",
                                          "targets": [{"query": [n - 1, n], "keys": [[n - 2, n - 1]]}],
                                          "distractors": [[0, 1]]}) for n in range(3, 7)))
    out = tmp_path / "t.csv"
    res = CliRunner().invoke(app, ["classify", "--prompts", str(good), "--detectors", "prev", "-o", str(out), "-q"])
    assert res.exit_code == 0, res.output
    row = next(ln for ln in res.stdout.splitlines() if ln.lstrip().startswith("prev"))
    assert row.split()[:2] == ["prev", "(pref)"] and row.split()[3:5] == ["1", "L0H0"]  # its labelled head
    every = CliRunner().invoke(app, ["classify", "--prompts", str(good), "--detectors", "prev", "-q", "--all"])
    assert "prev: top 2 heads by preference accuracy (1 labelled)" in every.output  # the ranking, labelled or not
    table = read_table(out)
    assert list(table.columns[-3:]) == ["preference", "preference_ci_low", "preference_ci_high"]
    assert table.set_index("head").loc[0, "score"] == pytest.approx(1.0)
    fig = viz.ranking_figure(table, "prev")
    assert [t.type for t in fig.data] == ["bar", "bar"] and list(fig.data[1].x) == [0.5, 1.0]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "abc", "targets": [{"query": [0, 1], "keys": [[5, 6]]}]}) + "\n")
    res = CliRunner().invoke(app, ["classify", "--prompts", str(bad)])
    assert res.exit_code == 5
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "line 1: target 1 keys span 1 [5, 6] is out of range" in lines[0]
