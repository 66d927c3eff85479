"""The doctor on Hugging Face families other than GPT-2: it infers (query heads, key/value heads, head
width) from briefly trained weights whatever the config says.

The trained subjects are committed under tests/data/doctor/<family>/ (re-create them with
``python tests/data/make_doctor_models.py``): byte-level models of d_model 64 trained a few hundred
steps on Python source. A lying config keeps the projection widths (so ``transformers`` loads it without
a shape error) and changes the split, e.g. a Llama trained as (4, 2, 16) claimed as (2, 1, 32).
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
from headlens.doctor.families import HeadLayout, candidate_layouts, claimed_layout, read_config
from headlens.errors import CheckpointError, ConfigError
from tests.gqa_models import save_llama

DATA = Path(__file__).parents[1] / "data" / "doctor"
TRUE = {  # family -> (n_heads, n_kv_heads, head_dim) the weights were trained with
    "llama": (4, 2, 16),
    "qwen2": (4, 2, 16),  # q/k/v biases, no head_dim field: head_dim = d_model / n_heads
    "mistral": (4, 2, 16),  # sliding window 32 < the 64-token rows
    "gemma": (4, 1, 32),  # multi-query, head_dim 32 != d_model / n_heads
    "gpt_neox": (4, 4, 16),  # fused, per-head interleaved query_key_value; RoPE on half of each head
}
LIES = {  # family -> config fields of layouts that load without a shape error
    "llama": [{"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32},
              {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8}],
    "qwen2": [{"num_attention_heads": 2, "num_key_value_heads": 1}],
    "mistral": [{"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32}],
    "gemma": [{"num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16}],
    "gpt_neox": [{"num_attention_heads": 8}],
}
FAMILIES = list(TRUE)  # every fixture is committed: a missing one fails below, it is never filtered out
KW = dict(n_rows=8, seq_len=64)


def test_every_family_fixture_is_committed():
    missing = [f for f in FAMILIES for name in ("config.json", "model.safetensors")
               if not (DATA / f / name).is_file()]
    assert not missing, f"missing doctor fixtures {missing}: run python tests/data/make_doctor_models.py"


def _lying_copy(family: str, fields: dict, tmp_path: Path) -> Path:
    out = tmp_path / f"{family}-lie-{fields['num_attention_heads']}"
    shutil.copytree(DATA / family, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **fields}))
    return out


def test_candidate_layouts_keep_the_projection_widths():
    from transformers import GemmaConfig, GPTNeoXConfig, LlamaConfig

    llama = LlamaConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    assert claimed_layout(llama) == HeadLayout(2, 1, 32)
    assert [(x.n_heads, x.n_kv_heads, x.d_head) for x in candidate_layouts(llama, claimed_layout(llama))] == [
        (2, 1, 32), (4, 2, 16), (8, 4, 8), (16, 8, 4), (32, 16, 2)]  # RoPE: even widths only
    gemma = GemmaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=32)
    assert [x.n_kv_heads for x in candidate_layouts(gemma, claimed_layout(gemma))] == [1, 2, 4, 8, 16]
    neox = GPTNeoXConfig(hidden_size=64, num_attention_heads=4)  # no head_dim field: d_model / n_heads
    assert [x.n_heads for x in candidate_layouts(neox, claimed_layout(neox))] == [1, 2, 4, 8, 16, 32]
    assert claimed_layout(llama, n_heads=4) == HeadLayout(4, 2, 16)
    with pytest.raises(ConfigError, match="n_heads=3"):
        claimed_layout(llama, n_heads=3)


@pytest.mark.parametrize("family", FAMILIES)
def test_honest_trained_checkpoint_passes(family):
    report = check_checkpoint(DATA / family, **KW)
    assert report.passed, str(report)
    H, H_kv, dh = TRUE[family]
    assert (report.inferred_n_heads, report.inferred_n_kv_heads, report.family) == (H, H_kv, family)
    best = min(report.evidence, key=lambda e: e.loss)
    assert (best.n_heads, best.n_kv_heads, best.d_head) == (H, H_kv, dh)
    assert sorted(e.loss for e in report.evidence)[1] - best.loss > report.margin  # clearly the best


@pytest.mark.parametrize("family,lie", [(f, i) for f in FAMILIES for i in range(len(LIES[f]))])
def test_lying_config_is_caught_and_the_true_layout_recovered(family, lie, tmp_path):
    from transformers import AutoModelForCausalLM

    path = _lying_copy(family, LIES[family][lie], tmp_path)
    AutoModelForCausalLM.from_pretrained(str(path))  # transformers loads the lie without complaint
    report = check_checkpoint(path, **KW)
    assert not report.passed, str(report)
    assert (report.inferred_n_heads, report.inferred_n_kv_heads) == TRUE[family][:2], str(report)
    assert "config is wrong" in report.warnings[0]


def test_cli_exits_8_on_a_lie_and_0_on_the_honest_directory(tmp_path):
    runner = CliRunner()
    args = ["--rows", "8", "--seq-len", "64"]
    ok = runner.invoke(app, ["doctor", str(DATA / "llama"), *args])
    assert ok.exit_code == 0, ok.output
    assert "family          : llama" in ok.output and "PASSED" in ok.output
    lie = runner.invoke(app, ["doctor", f"hf:{_lying_copy('llama', LIES['llama'][0], tmp_path)}", "--json", *args])
    assert lie.exit_code == 8, lie.output
    data = json.loads(lie.stdout)
    assert (data["config_n_heads"], data["config_n_kv_heads"]) == (2, 1)
    assert (data["inferred_n_heads"], data["inferred_n_kv_heads"]) == (4, 2)
    asked = runner.invoke(app, ["doctor", str(DATA / "llama"), "--n-heads", "8", *args])
    assert asked.exit_code == 8 and "you asked for n_heads=8" in asked.output


def test_random_weights_are_neither_accused_nor_passed(tmp_path):
    """Untrained weights have no layout to find: no false alarm, and no pass either (inconclusive)."""
    path = save_llama(tmp_path / "random")
    torch.manual_seed(0)
    report = check_checkpoint(path, **KW)
    assert report.verdict == "inconclusive" and not report.passed, str(report)
    assert "INCONCLUSIVE" in str(report) and "config is wrong" not in str(report)


def test_encoders_and_unreadable_directories_are_one_line_errors(tmp_path):
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(CheckpointError, match="'bert' encoder"):
        check_checkpoint(tmp_path / "bert")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text(json.dumps({"model_type": "no-such-family"}))
    with pytest.raises(CheckpointError, match="transformers cannot read"):
        read_config(tmp_path / "odd")


def _random_family(name: str):
    from transformers import AutoModelForCausalLM, GPTJConfig, OPTConfig, Phi3Config

    common = dict(vocab_size=257, bos_token_id=256, eos_token_id=256, pad_token_id=256)
    cfg = {
        "gptj": GPTJConfig(n_embd=64, n_layer=1, n_head=4, rotary_dim=8, n_positions=64, **common),
        "opt": OPTConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, ffn_dim=64,
                         max_position_embeddings=64, word_embed_proj_dim=64, **common),
        "phi3": Phi3Config(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=64, max_position_embeddings=64, **common),
    }[name]
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).eval()


@pytest.mark.parametrize("name,layouts", [("gptj", 4), ("opt", 7), ("phi3", 5)])
def test_other_families_load_under_every_layout_without_false_alarm(name, layouts, tmp_path):
    """GPT-J (rotary_dim 8: narrower heads cannot run), OPT (no RoPE: odd widths too), Phi-3 (fused
    qkv with GQA), random weights: every layout the shapes allow is scored, no false alarm, no pass."""
    from tests.gqa_models import save_model

    report = check_checkpoint(save_model(_random_family(name), tmp_path / name), n_rows=4, seq_len=32)
    assert report.verdict == "inconclusive" and len(report.evidence) == layouts, str(report)
