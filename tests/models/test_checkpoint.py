"""Checkpoints: exact round trips, and a clear CheckpointError for every way a file can be wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import make_gpt
from safetensors.torch import save_file

import headlens
from headlens import CheckpointError, ModelConfig, Tokenizer, load_checkpoint, save_checkpoint
from headlens.models.checkpoint import FORMAT, load_metadata
from headlens.models.gpt import GPT


@pytest.fixture
def saved(tmp_path: Path) -> tuple[GPT, Path]:
    model = make_gpt(0)
    return model, save_checkpoint(model, tmp_path / "m.safetensors", metadata={"step": 7})


def _rewrite(path: Path, tensors: dict[str, torch.Tensor], header: dict[str, str]) -> Path:
    out = path.with_name("edited.safetensors")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out), metadata=header)
    return out


def _contents(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())


def test_round_trip_is_exact_and_keeps_config_tokenizer_metadata(saved):
    model, path = saved
    loaded = load_checkpoint(path)
    assert loaded.cfg == model.cfg and loaded.tokenizer == model.tokenizer
    tokens = torch.randint(0, 256, (2, 9))
    torch.testing.assert_close(loaded(tokens), model(tokens), atol=0, rtol=0)
    assert load_metadata(path) == {"step": 7}
    assert headlens.load(str(path)).cfg == model.cfg


def test_round_trip_char_level_tied_half(tmp_path):
    cfg = ModelConfig(n_layers=1, n_heads=2, d_model=16, n_ctx=16, d_vocab=7, tie_embeddings=True, attn_only=True)
    model = GPT(cfg, tokenizer=Tokenizer.char_level("ab()[]"), name="dyckish")
    path = save_checkpoint(model, tmp_path / "c.safetensors", half=True)
    loaded = load_checkpoint(path)
    assert loaded.tokenizer.alphabet == "ab()[]" and loaded.name == "dyckish"
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    tokens = loaded.to_tokens("(a[b])")
    torch.testing.assert_close(loaded(tokens), model(tokens), atol=1e-3, rtol=1e-2)


def test_n_heads_mismatch_names_both_values(saved):
    _, path = saved
    with pytest.raises(CheckpointError, match=r"n_heads=4.*n_heads=8"):
        load_checkpoint(path, config={"n_heads": 8})
    same_shapes = ModelConfig(n_layers=2, n_heads=2, d_model=32, n_ctx=64, d_vocab=257)
    with pytest.raises(CheckpointError, match=r"n_heads=4.*n_heads=2.*garbage"):
        load_checkpoint(path, config=same_shapes)
    assert load_checkpoint(path, config={"n_heads": 4, "d_model": 32}).cfg.n_heads == 4


def test_truncated_file(saved):
    _, path = saved
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"corrupt or truncated|not a readable safetensors"):
        load_checkpoint(path)


def test_garbage_file(tmp_path):
    path = tmp_path / "junk.safetensors"
    path.write_bytes(b"\x00\x01 this is not safetensors at all" * 10)
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        load_checkpoint(path)


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(CheckpointError, match=r"nope\.safetensors.*does not exist"):
        load_checkpoint(tmp_path / "nope.safetensors")


def test_missing_tensor(saved):
    _, path = saved
    tensors, header = _contents(path)
    del tensors["transformer.h.1.attn.c_proj.weight"]
    with pytest.raises(CheckpointError, match=r"missing tensors \['transformer.h.1.attn.c_proj.weight'\]"):
        load_checkpoint(_rewrite(path, tensors, header))


def test_extra_tensor(saved):
    _, path = saved
    tensors, header = _contents(path)
    tensors["transformer.h.2.attn.c_attn.weight"] = torch.zeros(96, 32)
    with pytest.raises(CheckpointError, match=r"unexpected tensors \['transformer.h.2.attn.c_attn.weight'\]"):
        load_checkpoint(_rewrite(path, tensors, header))


def test_wrong_shape(saved):
    _, path = saved
    tensors, header = _contents(path)
    tensors["transformer.h.0.mlp.c_fc.weight"] = torch.zeros(64, 32)
    with pytest.raises(CheckpointError, match=r"c_fc.weight.*\(64, 32\).*\(128, 32\)"):
        load_checkpoint(_rewrite(path, tensors, header))


def test_header_config_that_disagrees_with_weights(saved):
    _, path = saved
    tensors, header = _contents(path)
    cfg = json.loads(header["config"]) | {"d_model": 48, "d_head": 12}
    with pytest.raises(CheckpointError, match="shape"):
        load_checkpoint(_rewrite(path, tensors, header | {"config": json.dumps(cfg)}))
    bad = json.loads(header["config"]) | {"n_heads": 5}
    # d_head is stored, so n_heads=5 reads as five 8-wide heads (free head sizes are legal, tracr's are):
    # the weights, 4 heads wide, refuse it by name
    with pytest.raises(CheckpointError, match=r"c_attn.weight' has shape \(96, 32\), config expects \(120, 32\)"):
        load_checkpoint(_rewrite(path, tensors, header | {"config": json.dumps(bad)}))


def test_plain_safetensors_is_not_a_headlens_checkpoint(saved):
    _, path = saved
    tensors, _ = _contents(path)
    with pytest.raises(CheckpointError, match=r"not a headlens checkpoint.*hf:<dir>"):
        load_checkpoint(_rewrite(path, tensors, {"format": "pt"}))
    assert FORMAT == "headlens-checkpoint-v1"


def test_no_pickle_anywhere():
    """torch.load only ever with weights_only=True; no pickle module in the package."""
    root = Path(headlens.__file__).parent
    for source in root.rglob("*.py"):
        text = source.read_text()
        assert "import pickle" not in text, source
        for line in text.splitlines():
            if "torch.load(" in line:
                assert "weights_only=True" in line, f"{source}: {line.strip()}"


@pytest.mark.parametrize("spec", ['{"kind": "bpe"}', "not json", "[]"])
def test_bad_tokenizer_spec_in_header(saved, spec):
    _, path = saved
    tensors, header = _contents(path)
    with pytest.raises(CheckpointError, match="invalid tokenizer spec"):
        load_checkpoint(_rewrite(path, tensors, header | {"tokenizer": spec}))
