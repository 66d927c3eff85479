"""The doctor's evaluation sources and its sequential rule, on known answers (no model: per-row losses are given).

The sequential rule must save work only where the evidence is overwhelming: a layout nats worse is dropped
after 8 rows, layouts the rows cannot tell apart run every row (so an inconclusive check stays inconclusive),
and a dropped layout is compared with the best on exactly the rows it ran.
"""

from __future__ import annotations

import pytest
import torch

from headlens.doctor.racing import MIN_LOOK, looks, race, race_sources, take
from headlens.doctor.sources import EvalSource, evaluation_size, periodic_rows, periodic_sources, periods
from headlens.doctor.verdict import decide, status, weigh_source


def _rows(n: int, T: int = 9) -> list[torch.Tensor]:
    return [torch.arange(n * T).view(n, T) % 50 + 2]  # (N, T): ids only label the rows here


def _evaluator(means: dict[int, float], noise: float = 0.05):
    """Per-row losses ``mean + noise`` of each layout, rows taken in order; ``ran`` counts the rows each ran."""
    ran: dict[int, int] = dict.fromkeys(means, 0)
    table = {h: m + noise * torch.randn(1000, generator=torch.Generator().manual_seed(h), dtype=torch.float64)
             for h, m in means.items()}

    def evaluate(h, rows):
        n = sum(r.shape[0] for r in rows)
        ran[h] += n
        return table[h][ran[h] - n:ran[h]]

    return evaluate, ran


def test_looks_and_take_split_rows_across_length_groups():
    assert looks(48) == [8, 16, 32, 48] and looks(8) == [8] and looks(3) == [3]
    rows = [torch.zeros(3, 5, dtype=torch.long), torch.ones(4, 7, dtype=torch.long)]
    got = take(rows, 2, 5)
    assert [tuple(r.shape) for r in got] == [(1, 5), (2, 7)]


def test_a_clearly_worse_layout_stops_after_the_first_look_and_ties_run_to_the_end():
    evaluate, ran = _evaluator({1: 7.0, 2: 2.0, 4: 2.0})  # 1 is nats worse; 2 and 4 cannot be told apart
    per_row, left = race(evaluate, [2, 1, 4], _rows(48), margin=0.1, z_stop=6.0)
    assert left == [2, 4]
    assert ran == {1: MIN_LOOK, 2: 48, 4: 48}
    v = decide(per_row, _rows(48), claimed=2, margin=0.1, z_min=3.0)
    assert v.rows == {1: 8, 2: 48, 4: 48} and sorted(v.plausible) == [2, 4]
    assert status(v, 2) == "inconclusive"  # the tie stays a tie: nothing was tested
    assert v.gaps[1] == pytest.approx(5.0, abs=0.1)  # compared on the 8 rows it ran


def test_nothing_is_dropped_on_small_gaps_or_noisy_rows():
    evaluate, ran = _evaluator({1: 2.05, 2: 2.0})  # 0.05 nats: below the margin
    race(evaluate, [2, 1], _rows(32), margin=0.1, z_stop=6.0)
    assert ran == {1: 32, 2: 32}
    evaluate, ran = _evaluator({1: 3.0, 2: 2.0}, noise=3.0)  # a nat worse, but the rows are too noisy to say so
    race(evaluate, [2, 1], _rows(16), margin=0.1, z_stop=6.0)
    assert ran == {1: 16, 2: 16}


def test_fewer_rows_than_a_look_run_once_and_one_layout_runs_one_look():
    evaluate, ran = _evaluator({1: 9.0, 2: 2.0})
    race(evaluate, [2, 1], _rows(5), margin=0.1, z_stop=6.0)
    assert ran == {1: 5, 2: 5}  # never dropped on fewer than 8 rows
    evaluate, ran = _evaluator({2: 2.0})
    per_row, _ = race(evaluate, [2], _rows(48), margin=0.1, z_stop=6.0)
    assert ran == {2: MIN_LOOK}
    assert status(decide(per_row, _rows(48), 2, 0.1, 3.0), 2) == "inconclusive"  # alone, it was compared with nothing


def _source(name: str, n: int = 16) -> EvalSource:
    return EvalSource(name, _rows(n), name)


def _weigh(s, per_row, note):
    return weigh_source(s.name, s.description, per_row, s.rows, 1, 0.1, 3.0, n_vocab=64, note=note)


def test_layouts_ruled_out_on_a_fitting_source_are_not_run_again_but_the_claim_always_is():
    evaluate, ran = _evaluator({1: 7.0, 2: 0.5, 4: 8.0})  # 1 claimed (the lie), 2 true: losses below the unigram
    sources = [_source("text"), _source("random tokens (period 7)")]
    out, skipped = race_sources(evaluate, [1, 2, 4], sources, claimed=1, margin=0.1, z_min=3.0, weigh=_weigh,
                                all_sources=True)
    assert [s.status for s in out] == ["failed", "failed"] and not skipped
    assert set(out[1].verdict.losses) == {1, 2} and out[1].note == "not run: 1 layout clearly worse on the text"
    assert ran == {1: 16, 2: 16, 4: 8}


def test_once_a_fitting_source_decides_the_sources_after_it_are_not_run():
    evaluate, ran = _evaluator({1: 7.0, 2: 0.5, 4: 8.0})
    sources = [_source("text"), _source("random tokens (period 7)")]
    out, skipped = race_sources(evaluate, [1, 2, 4], sources, claimed=1, margin=0.1, z_min=3.0, weigh=_weigh)
    assert [s.name for s in out] == ["text"] and out[0].usable and skipped == ["random tokens (period 7)"]
    assert ran == {1: 8, 2: 8, 4: 8}


def test_a_source_that_does_not_fit_rules_nothing_out():
    evaluate, _ = _evaluator({1: 7.0, 2: 6.0, 4: 8.0})  # every loss above the rows' unigram loss: no fit
    out, _ = race_sources(evaluate, [1, 2, 4], [_source("text"), _source("random tokens (period 7)")], claimed=1,
                          margin=0.1, z_min=3.0, weigh=_weigh)
    assert not out[0].fit.fits and set(out[1].verdict.losses) == {1, 2, 4} and not out[1].note


def test_periodic_rows_repeat_distinct_ids_and_never_exceed_the_vocabulary():
    ids = torch.arange(2, 66)  # 64 ordinary ids
    assert periods(len(ids), 63) == [31, 15, 7] and periods(5, 63) == [5, 2]
    for p in (31, 15, 7):
        rows = periodic_rows(ids, 6, 64, p, bos=1, seed=3)  # (6, 64)
        assert rows.shape == (6, 64) and (rows[:, 0] == 1).all() and (rows[:, 1:] >= 2).all()
        body = rows[:, 1:]
        assert all(len(set(r[:p].tolist())) == p for r in body)  # without replacement: every copy unambiguous
        assert torch.equal(body[:, p:], body[:, :-p])  # period p exactly
    small = periodic_sources(torch.arange(5), 4, 64, bos=None, seed=0)
    assert [s.name for s in small] == ["random tokens (period 5)", "random tokens (period 2)"]
    assert small[0].rows[0].shape == (4, 64)  # no BOS column when the model has none


def test_evaluation_is_sized_to_the_model_unless_fixed():
    assert evaluation_size(100_000, 64) == (48, 64)  # tiny models: every row the context allows
    assert evaluation_size(100_000, 2048) == (48, 512)
    assert evaluation_size(135_000_000, 8192) == (16, 64)  # SmolLM2: two looks of 8 rows, 64 tokens each
    assert evaluation_size(135_000_000, 8192, n_rows=48, seq_len=512) == (48, 512)
    assert evaluation_size(135_000_000, 32, seq_len=512) == (32, 32)  # never beyond the context: more rows instead


def test_the_default_text_is_prose_for_tokenizers_that_read_words_and_python_for_bytes(tmp_path):
    from pathlib import Path

    from headlens.doctor.families import first_token, read_config, text_source, tokenizer
    from tests import word_llama
    from tests.hf_families import build

    def text(d):
        cfg, tok = read_config(d), tokenizer(d)
        return text_source(cfg, tok, first_token(d, cfg, tok)[0], 4, 64, 0, None), cfg

    words = word_llama.write_word_llama(tmp_path / "words", steps=0)  # a word-level tokenizer
    src, cfg = text(words)
    assert "English prose" in src.description and src.rows[0].shape == (4, 64)
    assert (src.rows[0][:, 0] == cfg.bos_token_id).all()  # its declared BOS first (no <|endoftext|> to prefer)
    byte = Path(__file__).parents[1] / "data" / "doctor" / "llama"  # headlens' byte tokenizer: 1 byte a token
    assert text(byte)[0].description.startswith("Python stdlib source")
    bpe = build("llama", tmp_path / "bpe")  # a BPE of a few hundred pieces: ~1.3 characters a token, bytes-like
    assert text(bpe)[0].description.startswith("Python stdlib source")
