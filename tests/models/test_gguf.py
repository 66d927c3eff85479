"""GGUF references (``gguf:PATH``, ``*.gguf``) on tiny files of several families written in-process
(:mod:`tests.gguf_files`, the inverse of transformers' GGUF reader): the loaded model reproduces the
original Hugging Face model (float files exactly, quantized files as their rounded weights), the cache
converts once per content, and the file's provenance reaches every output."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")

import headlens
from headlens.models.hf import gguf as hg
from tests.gguf_files import endoftext_tokenizer, rounded, tiny_model, write_gguf

TEXT = "def first(items):\n    return items[0] if items else None  # the first item, or None"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache of this test's own: conversions here never touch another test's."""
    root = tmp_path / "cache"
    monkeypatch.setenv("HEADLENS_CACHE", str(root))
    return root


def load(ref: str | Path):
    """``headlens.load`` and the lines it said."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = headlens.load(ref if isinstance(ref, str) else f"gguf:{ref}")
    return model, [str(w.message) for w in caught]


def file_tokenizer(path: Path):
    """The tokenizer transformers itself builds from the file (by architecture: Qwen2's splits digits its way)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def eager_reference(hf_model, tokens: torch.Tensor):
    with torch.no_grad():
        out = hf_model(tokens, output_attentions=True)
    return out.logits, out.attentions


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma2", "gemma3", "phi3", "gpt2"])
def test_a_float_gguf_of_each_family_loads_as_the_original_model(family, tmp_path, cache):
    hf_model, tok = tiny_model(family)
    path = write_gguf(hf_model, tok, tmp_path / f"{family}.gguf", "F32")
    model, said = load(path)
    tokens = model.to_tokens(TEXT)  # (1, T): longer than Gemma's sliding window of 16
    assert tokens.shape[1] > 24
    assert tokens[0, 1:].tolist() == file_tokenizer(path)(TEXT, add_special_tokens=False)["input_ids"]
    logits, attentions = eager_reference(hf_model, tokens)
    _, cache_ = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("attn.hook_pattern"))
    torch.testing.assert_close(model(tokens), logits, atol=1e-5, rtol=1e-5)
    for layer, reference in enumerate(attentions):  # every head in its place: Q/K permutation, GQA groups
        torch.testing.assert_close(cache_[f"blocks.{layer}.attn.hook_pattern"], reference, atol=1e-5, rtol=1e-5)
    assert model.source["architecture"] == {"gemma3": "gemma3"}.get(family, family)
    assert model.source["sha256"] == hg.sha256_of(path) and model.source["quantization"] == "F32"
    assert [line for line in said if "GGUF float weights" in line] == [model.substitutions[0]]


@pytest.mark.parametrize(("family", "qtype"), [("llama", "Q8_0"), ("qwen2", "Q4_0")])
def test_a_quantized_gguf_is_the_model_with_its_weights_rounded(family, qtype, tmp_path, cache):
    hf_model, tok = tiny_model(family)
    path = write_gguf(hf_model, tok, tmp_path / f"{family}-{qtype}.gguf", qtype)
    model, said = load(path)
    tokens = model.to_tokens(TEXT)
    ours = model(tokens)
    with torch.no_grad():
        reference = rounded(hf_model, qtype)(tokens).logits  # every 2-D weight through quantize -> dequantize
        original = hf_model(tokens).logits
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)
    assert (ours - original).abs().max() > 1e-3  # the rounding is real: the original is not what runs
    n_quantized = sum(p.ndim == 2 for n, p in hf_model.named_parameters() if "norm" not in n)
    assert model.source["quantization"] == qtype and model.source["tensor_types"][qtype] == n_quantized
    note = next(line for line in said if "dequantized from" in line)
    assert f"dequantized from {qtype} ({qtype} {n_quantized} tensors; F32 " in note and "quantized model" in note


@pytest.fixture
def q8_file(tmp_path):
    hf_model, tok = tiny_model("llama")
    return write_gguf(hf_model, tok, tmp_path / "tiny-q8.gguf", "Q8_0"), hf_model


def folders(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "gguf").iterdir() if p.is_dir())


def test_the_second_load_reads_the_cache_and_says_the_note_again(q8_file, cache, monkeypatch):
    path, _ = q8_file
    first, said_first = load(path)
    (folder,) = folders(cache)
    stamp = (cache / "gguf" / folder / "model.safetensors").stat().st_mtime_ns

    def no_dequantizing(*args, **kwargs):
        raise AssertionError("a cached file was dequantized again")

    monkeypatch.setattr(hg, "_dequantize_into", no_dequantizing)
    second, said_second = load(path)
    tokens = first.to_tokens(TEXT)
    torch.testing.assert_close(second(tokens), first(tokens), atol=0, rtol=0)
    assert folders(cache) == [folder]
    assert (cache / "gguf" / folder / "model.safetensors").stat().st_mtime_ns == stamp
    for said in (said_first, said_second):  # one line, every load
        assert sum("dequantized from Q8_0" in line for line in said) == 1


def test_another_content_gets_another_folder_even_at_the_same_path(q8_file, cache):
    path, _ = q8_file
    before, _ = load(path)
    tokens = before.to_tokens(TEXT)
    other, tok = tiny_model("llama", seed=1)
    write_gguf(other, tok, path, "Q8_0")  # same name, same size, new weights
    after, _ = load(path)
    assert len(folders(cache)) == 2
    assert after.source["sha256"] != before.source["sha256"]
    with torch.no_grad():
        torch.testing.assert_close(after(tokens), rounded(other, "Q8_0")(tokens).logits, atol=1e-5, rtol=1e-5)


def test_the_cache_folder_appears_complete_or_not_at_all(q8_file, cache, monkeypatch):
    path, hf_model = q8_file
    real = hg._dequantize_into

    def dies_halfway(info, out, dtype):
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt  # the user's Ctrl+C in the middle of a conversion

    monkeypatch.setattr(hg, "_dequantize_into", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        load(path)
    assert folders(cache) == [] and not [p for p in (cache / "gguf").iterdir() if p.name.startswith(".")]
    target = hg.cache_dir(path, hg.sha256_of(path))
    target.mkdir()  # a folder left by an older headlens without the marker: not used, replaced
    (target / "config.json").write_text("{}")
    monkeypatch.setattr(hg, "_dequantize_into", real)
    model, _ = load(path)
    assert (target / hg.MARKER).is_file() and folders(cache) == [target.name]
    tokens = model.to_tokens(TEXT)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), rounded(hf_model, "Q8_0")(tokens).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("umask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_cache_files_get_the_users_umask(q8_file, cache, umask, file_mode, dir_mode):
    path, _ = q8_file
    old = os.umask(umask)
    try:
        hg.converted(path)
    finally:
        os.umask(old)
    folder = cache / "gguf" / folders(cache)[0]
    assert folder.stat().st_mode & 0o777 == dir_mode
    for f in [*folder.iterdir(), cache / "gguf" / "sha256.json"]:
        assert f.stat().st_mode & 0o777 == file_mode, f.name


def test_the_files_provenance_reaches_every_output(q8_file, cache, tmp_path):
    from headlens.scoring.table import write_table
    from headlens.viz.report import PROVENANCE_TAG, write_report

    path, _ = q8_file
    model, _ = load(path)
    sha = model.source["sha256"]
    table = headlens.classify(model, detectors="previous_token,first_token", n_prompts=10, seq_len=24, n_boot=50)
    write_table(table, tmp_path / "scores.csv")
    sweep = headlens.sweep(model, groups=[((1, 0),)], metrics=["repeated_loss"], n_prompts=4, n_control=1)
    edges = headlens.circuit(model, receivers=["L1H0"], n_prompts=4, inputs="k")
    report = write_report(model, table, tmp_path / "report.html")
    page = Path(report).read_text()
    embedded = json.loads(page.split(PROVENANCE_TAG)[1].split("</script>")[0])
    sidecar = json.loads((tmp_path / "scores.csv.json").read_text())["headlens"]
    for what, attrs in {"table": table.attrs, "sidecar": sidecar, "sweep": sweep.attrs, "edges": edges.attrs,
                        "report": embedded}.items():
        assert "source" in attrs, what
        assert attrs["source"]["sha256"] == sha and attrs["source"]["quantization"] == "Q8_0"
        assert attrs["source"]["tensor_types"]["Q8_0"] > 0
        assert any("dequantized from Q8_0" in line for line in attrs["substitutions"])
    assert "What runs:" in page and "dequantized from Q8_0" in page


@pytest.mark.parametrize(("add_bos", "first", "rule"), [(False, "<|endoftext|>", "document_separator"),
                                                        (True, "<|bos|>", "adds_bos")])
def test_what_position_zero_holds_follows_the_files_add_bos_token(add_bos, first, rule, tmp_path, cache):
    hf_model, _ = tiny_model("qwen2")
    tok = endoftext_tokenizer()  # declares <|bos|>, has <|endoftext|>: SmolLM2's situation on another family
    model, said = load(write_gguf(hf_model, tok, tmp_path / f"bos-{add_bos}.gguf", "F32", add_bos=add_bos))
    first_id = tok.convert_tokens_to_ids(first)
    assert model.prefix.rule == rule and model.bos_token_id == first_id
    assert model.to_tokens(TEXT)[0].tolist() == [first_id, *tok(TEXT, add_special_tokens=False)["input_ids"]]
    lines = [line for line in said if "adds no BOS" in line]
    assert lines == ([f"'bos-False': its tokenizer adds no BOS, so prompts start with '<|endoftext|>' (id "
                      f"{first_id}), the pretraining document separator, not its bos_token '<|bos|>' "
                      f"(docs/real-models.md)"] if not add_bos else [])
    table = headlens.classify(model, detectors="first_token", n_prompts=10, seq_len=16, n_boot=20)
    assert table.attrs["first_position"]["token"] == first and table.attrs["first_position"]["rule"] == rule
