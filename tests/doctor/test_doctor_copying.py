"""The doctor's copying evidence on a small vocabulary.

The subject, tests/data/doctor/copier/ (made by tests/data/make_doctor_models.py), is a 2-layer GQA Llama
(4 query / 2 key-value heads of width 16) over 64 token ids, trained by headlens' training code on random
symbols in which a segment repeats at a random period 5..25: it copies the repeats. Its context is 512.
The doctor's random segments used to be as long as half a row (127 ids at 256 tokens, 255 at 512) over
63 ids: ids recurred inside a segment, copying was ambiguous, even the true layout predicted them worse
than their frequencies, and the doctor said INCONCLUSIVE for the honest config and for a lie alike. Its
segments are now drawn without replacement, never longer than the vocabulary, at several periods.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from typer.testing import CliRunner

from headlens.cli import app

runner = CliRunner()
COPIER = Path(__file__).parents[1] / "data" / "doctor" / "copier"
LIE = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32}
ARGS = ["--rows", "16", "--seq-len", "256", "--json", "-q"]  # 256 tokens: old segments of 127 ids over 63


def _doctor(d: Path):
    result = runner.invoke(app, ["doctor", f"hf:{d}", *ARGS])
    return result, json.loads(result.stdout) if result.stdout.startswith("{") else None


def _copy(tmp_path: Path, name: str, fields: dict) -> Path:
    out = shutil.copytree(COPIER, tmp_path / name)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **fields}))
    return out


def test_the_fixture_is_committed_and_small():
    assert (COPIER / "config.json").is_file() and (COPIER / "model.safetensors").stat().st_size < 400_000
    config = json.loads((COPIER / "config.json").read_text())
    assert (config["vocab_size"], config["num_attention_heads"], config["num_key_value_heads"]) == (64, 4, 2)


def test_honest_copier_passes_on_segments_no_longer_than_the_vocabulary():
    result, data = _doctor(COPIER)
    assert result.exit_code == 0, result.output
    used = next(s for s in data["sources"] if s["used"])
    assert used["name"].startswith("random tokens (period") and used["fits"]
    period = int(used["name"].split("period ")[1].rstrip(")"))
    assert period <= 63  # 63 ordinary ids (BOS excluded): every id at most once per segment
    assert (data["inferred_n_heads"], data["inferred_n_kv_heads"]) == (4, 2)


def test_a_lying_config_is_caught(tmp_path):
    from transformers import AutoModelForCausalLM

    lie = _copy(tmp_path, "lie", LIE)
    AutoModelForCausalLM.from_pretrained(str(lie))  # loads without a word
    result, data = _doctor(lie)
    assert result.exit_code == 8, result.output
    assert (data["config_n_heads"], data["config_n_kv_heads"]) == (2, 1)
    assert (data["inferred_n_heads"], data["inferred_n_kv_heads"]) == (4, 2)
    assert next(s for s in data["sources"] if s["used"])["name"].startswith("random tokens")


def test_an_untrained_copy_is_inconclusive_never_passed(tmp_path):
    from transformers import AutoConfig, LlamaForCausalLM

    out = tmp_path / "untrained"
    torch.manual_seed(0)
    LlamaForCausalLM(AutoConfig.from_pretrained(str(COPIER))).save_pretrained(str(out))
    for f in COPIER.glob("tokenizer*"):
        shutil.copy(f, out / f.name)
    result, data = _doctor(out)
    assert result.exit_code == 9, result.output
    assert data["verdict"] == "inconclusive" and not data["passed"]
    assert all(not s["fits"] for s in data["sources"] if s["name"].startswith("random tokens"))
    assert any("do not fit this model" in w and "does not copy" in w for w in data["warnings"])
