"""check_checkpoint recovers the head count a checkpoint was trained with, whatever its config says."""

from __future__ import annotations

import json

import pytest
import torch
from doctor_subjects import (
    TRUE_N_HEADS,
    evaluation_texts,
    trained_model,
    write_hf_dir,
    write_lying_checkpoint,
)

from headlens.doctor import check_checkpoint
from headlens.doctor.checkpoint import model_with_heads, read_weights
from headlens.errors import CheckpointError, ConfigError
from headlens.models.checkpoint import load_checkpoint, load_metadata, save_checkpoint

TEXTS = evaluation_texts()


@pytest.fixture(scope="module")
def model():
    return trained_model()


def test_correct_checkpoint_passes(model, tmp_path) -> None:
    path = save_checkpoint(model, tmp_path / "ok.safetensors")
    report = check_checkpoint(path, texts=TEXTS)
    assert report.passed, str(report)
    assert report.inferred_n_heads == report.config_n_heads == TRUE_N_HEADS
    assert not report.warnings and report.plausible_n_heads == [TRUE_N_HEADS]
    assert [e.n_heads for e in report.evidence] == [1, 2, 4, 8, 16, 32]
    best = min(report.evidence, key=lambda e: e.loss)
    assert best.n_heads == TRUE_N_HEADS and best.delta == 0.0
    others = sorted(e.loss for e in report.evidence if e.n_heads != TRUE_N_HEADS)
    assert others[0] - best.loss > report.margin  # the true split is clearly better


@pytest.mark.parametrize("lie", [2, 8])
def test_lying_config_is_caught_and_true_count_recovered(model, tmp_path, lie: int) -> None:
    path = write_lying_checkpoint(model, tmp_path / "lie.safetensors", lie)
    assert load_checkpoint(path).cfg.n_heads == lie  # the lie loads without complaint
    report = check_checkpoint(path, texts=TEXTS)
    assert not report.passed
    assert report.config_n_heads == lie and report.inferred_n_heads == TRUE_N_HEADS
    assert any("config is wrong" in w for w in report.warnings)


def test_n_heads_option_is_checked_against_the_weights(model, tmp_path) -> None:
    path = save_checkpoint(model, tmp_path / "ok.safetensors")
    assert check_checkpoint(path, n_heads=TRUE_N_HEADS, texts=TEXTS).passed
    report = check_checkpoint(path, n_heads=8, texts=TEXTS)
    assert not report.passed and report.claimed_n_heads == 8 and report.inferred_n_heads == TRUE_N_HEADS
    with pytest.raises(ConfigError, match="does not divide"):
        check_checkpoint(path, n_heads=5, texts=TEXTS)


def test_hf_directory_with_lying_config(model, tmp_path) -> None:
    honest = check_checkpoint(write_hf_dir(model, tmp_path / "hf_ok"), texts=TEXTS)
    assert honest.passed and honest.format == "huggingface", str(honest)
    report = check_checkpoint(write_hf_dir(model, tmp_path / "hf_lie", claimed_n_heads=2), texts=TEXTS)
    assert not report.passed and report.config_n_heads == 2 and report.inferred_n_heads == TRUE_N_HEADS


def test_hf_pytorch_bin_is_read_with_weights_only(model, tmp_path) -> None:
    d = write_hf_dir(model, tmp_path / "hf_bin")
    from safetensors.torch import load_file

    torch.save(load_file(str(d / "model.safetensors")), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    w = read_weights(d)
    with torch.no_grad():
        torch.testing.assert_close(model_with_heads(w, TRUE_N_HEADS)(torch.tensor([[16, 1, 2, 3]])),
                                   model(torch.tensor([[16, 1, 2, 3]])))


def test_report_json_and_text(model, tmp_path) -> None:
    report = check_checkpoint(write_lying_checkpoint(model, tmp_path / "lie.safetensors", 8), texts=TEXTS)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["inferred_n_heads"] == TRUE_N_HEADS and data["passed"] is False
    assert {"n_heads", "d_head", "loss", "delta"} <= set(data["evidence"][0])
    text = str(report)
    assert "FAILED" in text and "<= best" in text and "<= claimed" in text


def test_bad_paths_are_checkpoint_errors(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        check_checkpoint(tmp_path / "nope.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError):
        check_checkpoint(tmp_path / "junk.safetensors")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(CheckpointError, match=r"config\.json"):
        check_checkpoint(tmp_path / "empty_dir")


def test_default_evaluation_text_for_char_models_is_repeated_segments(model, tmp_path) -> None:
    report = check_checkpoint(save_checkpoint(model, tmp_path / "ok.safetensors"), candidates=[4])
    assert [s.name for s in report.sources] == [f"random tokens (period {p})" for p in (16, 8, 4)]
    assert "random segments of 4 distinct ids of 16, repeated" in report.evaluation
    with pytest.raises(CheckpointError, match="empty"):
        check_checkpoint(tmp_path / "ok.safetensors", texts=["", "  "])


ZOO_NAMES = ["induction-2l", "code", "dyck"]
# the byte-level code model needs full 256-byte contexts to show its heads (~10 s per check): slow
ZOO_PARAMS = ["induction-2l", pytest.param("code", marks=pytest.mark.slow), "dyck"]


def _zoo_model(name: str):
    from headlens.zoo import ZOO, weights_dir

    path = ZOO[name].path if name in ZOO else weights_dir() / f"{name}.safetensors"
    if not path.is_file():
        pytest.skip(f"zoo model {name!r} has no weights in this checkout")
    return path, load_checkpoint(path)


def _lie(path, model, tmp_path, lie: int):
    from headlens.doctor.demo import save_with_claimed_heads

    return save_with_claimed_heads(model, tmp_path / f"lie{lie}.safetensors", lie, load_metadata(path))


@pytest.mark.parametrize("name", ZOO_PARAMS)
def test_zoo_model_honest_passes_and_doubled_n_heads_is_caught(name: str, tmp_path) -> None:
    path, model = _zoo_model(name)
    honest = check_checkpoint(path)
    assert honest.passed, str(honest)
    true_h = model.cfg.n_heads
    report = check_checkpoint(_lie(path, model, tmp_path, 2 * true_h))  # the harder lie: finer split
    assert not report.passed and report.inferred_n_heads == true_h, str(report)


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_model_halved_n_heads_is_caught(name: str, tmp_path) -> None:
    path, model = _zoo_model(name)
    true_h = model.cfg.n_heads
    report = check_checkpoint(_lie(path, model, tmp_path, true_h // 2))
    assert not report.passed and report.inferred_n_heads == true_h, str(report)
