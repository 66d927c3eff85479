"""The doctor never passes on no evidence: a word-level GQA Llama whose tokenizer makes Python source the
unknown token almost everywhere (``tests/word_llama.py``).

Before evidence sources were weighed, every layout had about the same loss on that text and the doctor
printed PASSED for a config that lies; now the text is reported as not fitting the model, the random-token
source (each sequence repeated) decides, and untrained weights are INCONCLUSIVE (exit 9), never passed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from headlens.cli import app
from headlens.doctor import check_checkpoint
from headlens.doctor.verdict import text_fit
from tests import word_llama

runner = CliRunner()
KW = dict(n_rows=16, seq_len=64)


@pytest.fixture(scope="session")
def word_dirs(request, tmp_path_factory) -> dict[str, Path]:
    """honest / lying / untrained directories, trained once (a few seconds) and kept in pytest's cache."""
    name = f"word-llama-{word_llama.STEPS}-torch{torch.__version__}"
    cache = (request.config.cache.mkdir(name) if getattr(request.config, "cache", None) is not None
             else tmp_path_factory.mktemp(name))  # -p no:cacheprovider: trained again, a few seconds
    out = {}
    for name, steps in (("honest", word_llama.STEPS), ("untrained", 0)):
        d = cache / name
        if not (d / "config.json").is_file():
            shutil.rmtree(d, ignore_errors=True)
            word_llama.write_word_llama(d, steps)
        out[name] = d
    out["lying"] = word_llama.lie(Path(shutil.copytree(out["honest"], tmp_path_factory.mktemp("lie") / "lying")))
    text = tmp_path_factory.mktemp("text") / "words.txt"
    text.write_text("\n".join(word_llama.texts()) + "\n")
    out["text"] = text
    return out


def _doctor(d: Path, *args: str):
    return runner.invoke(app, ["doctor", f"hf:{d}", "--rows", "16", "--seq-len", "64", *args])


def test_lying_config_exits_8_on_the_random_token_source(word_dirs):
    result = _doctor(word_dirs["lying"], "--json")
    assert result.exit_code == 8, result.output
    data = json.loads(result.stdout)
    assert data["verdict"] == "failed"
    assert (data["inferred_n_heads"], data["inferred_n_kv_heads"]) == (4, 2)
    text, *random = data["sources"]
    assert text["name"] == "text" and text["fits"] is False and not text["used"]
    assert "English prose" in text["description"]  # a word-level tokenizer reads words: prose, all unknown here
    assert text["unknown_share"] > 0.9 and text["distinct_tokens"] <= 2
    # trained on "<bos> r r" (31 words repeated once), it copies 31 back: that period decides, the others not run
    assert [s["name"] for s in random] == ["random tokens (period 31)"]
    assert data["skipped_sources"] == ["random tokens (period 15)", "random tokens (period 7)"]
    period_31 = random[0]
    assert period_31["fits"] is True and period_31["used"] and period_31["status"] == "failed"
    assert any("does not fit this model" in w for w in data["warnings"])


def test_honest_config_exits_0(word_dirs):
    result = _doctor(word_dirs["honest"])
    assert result.exit_code == 0, result.output
    assert "checkpoint check: PASSED" in result.output and "fit: NO" in result.output


def test_untrained_weights_are_inconclusive_never_passed(word_dirs):
    report = check_checkpoint(word_dirs["untrained"], **KW)
    assert report.verdict == "inconclusive" and not report.passed, str(report)
    assert all(s.status == "inconclusive" or not s.fits for s in report.sources)
    result = _doctor(word_dirs["untrained"])
    assert result.exit_code == 9, result.output
    assert "INCONCLUSIVE" in result.output and "PASSED" not in result.output


def test_text_in_the_models_own_vocabulary_fits_and_separates(word_dirs):
    report = check_checkpoint(word_dirs["lying"], texts=word_llama.texts(), **KW)
    text = report.sources[0]
    assert text.fits and text.status == "failed" and text.unknown_share == 0.0, str(report)
    best = min(text.evidence, key=lambda e: e.loss)
    claimed = next(e for e in text.evidence if e.n_heads == 2)
    assert (best.n_heads, best.n_kv_heads) == (4, 2) and claimed.loss - best.loss > 1.0
    result = _doctor(word_dirs["lying"], "--text", str(word_dirs["text"]))
    assert result.exit_code == 8, result.output


def test_text_fit_known_answers():
    rows = [torch.tensor([[1, 2, 3, 2, 3]])]  # targets 2 3 2 3: unigram entropy log 2
    fit = text_fit(rows, model_loss=0.1, n_vocab=8, unknown_id=0)
    assert fit.fits and fit.distinct_tokens == 2 and fit.unigram_loss == pytest.approx(0.6931, abs=1e-4)
    worse = text_fit(rows, model_loss=0.7, n_vocab=8, unknown_id=3)
    assert worse.unknown_share == 0.5 and len(worse.problems) == 2  # half unknown, no better than unigram
