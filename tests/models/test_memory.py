"""Knowing before running out (:mod:`headlens.models.memory`): the shape read from headers equals the
model's own, and a model that will not fit is refused in one line, with its exit code, before any
weight is read; a limit set by ``$HEADLENS_MEMORY_LIMIT``, never by exhausting RAM."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("gguf")

from headlens.cli import app
from headlens.errors import MemoryLimitError
from headlens.models import memory
from tests.gguf_files import tiny_model, write_gguf


@pytest.fixture
def gguf_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path / "cache"))
    hf_model, tok = tiny_model("llama")
    return write_gguf(hf_model, tok, tmp_path / "tiny.gguf", "Q8_0"), hf_model


def test_the_shape_from_a_gguf_header_is_the_models_own(gguf_file):
    path, hf_model = gguf_file
    shape = memory.model_shape(f"gguf:{path}")
    assert shape.n_params == sum(p.numel() for p in hf_model.parameters())  # untied: the head counted
    assert (shape.n_heads, shape.d_vocab) == (hf_model.config.num_attention_heads, hf_model.config.vocab_size)


def test_the_shape_of_an_hf_directory_is_its_safetensors(tmp_path):
    hf_model, _ = tiny_model("gemma3")  # tied head: stored, and counted, once
    hf_model.save_pretrained(tmp_path / "hf")
    shape = memory.model_shape(f"hf:{tmp_path / 'hf'}")
    stored = {p.data_ptr(): p.numel() for p in hf_model.parameters()}
    assert shape.n_params == sum(stored.values())
    assert (shape.n_heads, shape.d_vocab) == (hf_model.config.num_attention_heads, hf_model.config.vocab_size)


def test_the_default_batch_is_classifys():
    from headlens.scoring.defaults import BATCH_SIZE, SEQ_LEN

    assert memory.DEFAULT_BATCH == (BATCH_SIZE, SEQ_LEN)


def test_weights_and_activations_by_hand():
    shape = memory.ModelShape(n_params=3_000_000_000, n_heads=24, d_vocab=128_256)
    weights, acts = memory.needed(shape, "bfloat16", batch_size=8, seq_len=512)
    assert weights == 6_000_000_000
    assert acts == 8 * 512 * 128_256 * 4 + 2 * 8 * 24 * 512 * 512 * 4  # logits + scores and pattern


@pytest.mark.parametrize(("text", "n"), [("6GB", 6e9), ("512MiB", 2**29), ("1000", 1000), ("1.5 gib", 1.5 * 2**30)])
def test_the_limit_variable_reads_sizes(text, n, monkeypatch):
    monkeypatch.setenv(memory.ENV, text)
    assert memory.available() == (int(n), f"${memory.ENV}")


def test_without_the_variable_the_figure_is_the_machines(monkeypatch):
    monkeypatch.delenv(memory.ENV, raising=False)
    room, where = memory.available()
    assert 0 < room and where in ("MemAvailable", "the cgroup's memory limit")


def test_a_model_that_does_not_fit_is_refused_in_one_line_before_any_weight_is_read(gguf_file, tmp_path,
                                                                                    monkeypatch):
    path, _ = gguf_file
    weights = memory.model_shape(f"gguf:{path}").n_params * 4
    monkeypatch.setenv(memory.ENV, str(memory.BASE + weights // 2))  # not even the float32 weights fit
    result = CliRunner().invoke(app, ["classify", "--model", f"gguf:{path}", "--batch-size", "4",
                                      "--seq-len", "16", "--n-prompts", "8"])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == MemoryLimitError.exit_code == 10, result.output
    assert len(lines) == 1 and lines[0].startswith("headlens: error:") and "Traceback" not in result.output
    line = lines[0]
    assert f"{weights / 1e6:.1f} MB in float32" in line and "batch of 4 x 16 tokens" in line  # the numbers
    assert "--dtype bfloat16" in line and "--batch-size" in line and "--device-map auto --offload-folder" in line
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").glob("tiny-*"))


def test_the_ways_out_pass_the_check(gguf_file, monkeypatch):
    path, _ = gguf_file
    shape = memory.model_shape(f"gguf:{path}")
    f32, acts = memory.needed(shape, "float32", 1, 16)
    monkeypatch.setenv(memory.ENV, str(memory.BASE + int(memory.MARGIN * (f32 / 2 + acts)) + 1))  # bfloat16 fits, float32 not
    with pytest.raises(MemoryLimitError, match="ways out: --dtype bfloat16"):
        memory.check_fits(f"gguf:{path}", "float32", batch=(1, 16))
    memory.check_fits(f"gguf:{path}", "bfloat16", batch=(1, 16))
    with pytest.raises(MemoryLimitError) as err:
        memory.check_fits(f"gguf:{path}", "bfloat16", batch=(64, 16))  # a batch too big: no bfloat16 to offer
    assert "--dtype" not in str(err.value) and "--batch-size" in str(err.value)
    memory.check_fits(f"gguf:{path}", "float32", device_map="auto", batch=(64, 16))  # accelerate places it


def test_a_gguf_from_the_cache_loads_with_its_layers_offloaded_to_disk(gguf_file, tmp_path):
    import headlens

    path, hf_model = gguf_file
    model = headlens.load(f"gguf:{path}", device_map="auto", max_memory={"cpu": "20KB"},
                          offload_folder=str(tmp_path / "offload"))
    tokens = model.to_tokens("def first(items): return items[0]")
    import torch

    from tests.gguf_files import rounded

    with torch.no_grad():
        torch.testing.assert_close(model(tokens), rounded(hf_model, "Q8_0")(tokens).logits, atol=1e-5, rtol=1e-5)
    assert json.loads((tmp_path / "cache" / "gguf" / "sha256.json").read_text())
