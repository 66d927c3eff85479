"""A Hugging Face directory without a tokenizer: generated probes run on ids, text is refused in one line."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch
from hf_families import N_HEADS, VOCAB, build

import headlens
from headlens.cli import main
from headlens.errors import ProbeError
from headlens.models.vocab import vocab


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"hf:{build('llama', tmp_path_factory.mktemp('bare') / 'llama', tokenizer=False)}"


@pytest.fixture(scope="module")
def model(bare):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = headlens.load(bare)
    said = [w for w in caught if "no tokenizer" in str(w.message)]
    assert len(said) == 1 and f"vocab_size={VOCAB}" in str(said[0].message)
    assert said[0].filename == __file__  # the warning points at the caller's line, not at headlens' loader
    return loaded


def test_generated_probes_draw_ids_from_the_config(model):
    assert model.tokenizer is None
    v = vocab(model)
    bos, eos, pad = (model.hf_config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id"))
    assert v.prefix == (bos,) and v.suffix == () and v.brackets == ()
    assert set(v.ordinary) == set(range(VOCAB)) - {bos, eos, pad}
    df = headlens.classify(model, n_prompts=10, seq_len=32, detectors=["previous_token", "induction", "first_token"])
    assert len(df) == 3 * 2 * N_HEADS and df.score.between(0, 1).all()
    skipped = headlens.classify(model, n_prompts=10, seq_len=16).attrs["skipped"]  # default detectors
    for name in ("bracket_matching", "bracket_matching_hard", "open_bracket", "coreference"):
        assert "needs a tokenizer" in skipped[name], skipped
    with pytest.raises(ProbeError, match="bracket_matching needs a tokenizer"):  # asked for by name: refused
        headlens.classify(model, n_prompts=10, seq_len=16, detectors=["bracket_matching"])


def test_text_is_refused_naming_the_missing_files(model):
    with pytest.raises(ProbeError, match=r"has no tokenizer \(none of tokenizer\.json, tokenizer_config\.json"):
        model.to_tokens("hello")
    with pytest.raises(ProbeError, match="has no tokenizer"):
        headlens.classify(model, prompts=["hello world"])
    assert model.to_str_tokens(torch.tensor([[5, 7]])) == ["<5>", "<7>"]


def _cli(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["headlens", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    return exit_info.value.code or 0, out, err


def test_cli_classify_and_ablate_run_with_one_warning(bare, monkeypatch, capsys, tmp_path):
    code, out, err = _cli(monkeypatch, capsys, "classify", "--model", bare, "--n-prompts", "10", "--seq-len", "24",
                          "--detectors", "previous_token,induction", "-q")
    assert code == 0, err
    warned = [line for line in err.splitlines() if "warning" in line.lower()]
    assert len(warned) == 1 and "no tokenizer" in warned[0] and f"vocab_size={VOCAB}" in warned[0], err
    code, out, err = _cli(monkeypatch, capsys, "ablate", "--model", bare, "--heads", "L1H2", "--method", "zero",
                          "--n-prompts", "4", "--n-control", "1")
    assert code == 0, err
    assert "repeated_loss" in out and "Traceback" not in err
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello world\n")
    code, out, err = _cli(monkeypatch, capsys, "classify", "--model", bare, "--prompts", str(prompts), "-q")
    errors = [line for line in err.splitlines() if line.startswith("headlens: error:")]
    assert code == 5 and len(errors) == 1 and "tokenizer.json" in errors[0], err


def test_gpt2_without_tokenizer(tmp_path):
    """The case that crashed in probes.py: transformers builds GPT-2 an empty tokenizer from nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = headlens.load(f"hf:{build('gpt2', tmp_path / 'gpt2', tokenizer=False)}")
    assert model.tokenizer is None and len(vocab(model).ordinary) == VOCAB - 3
    df = headlens.classify(model, n_prompts=10, seq_len=24, detectors=["previous_token", "induction"])
    assert len(df) == 2 * 2 * N_HEADS


def test_dashboard_says_in_one_line_why_there_is_no_text_box(bare, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from headlens.app import helpers as hd

    monkeypatch.setattr(hd, "DEFAULT_N_PROMPTS", 4)
    monkeypatch.setenv(hd.MODEL_ENV, bare)
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "apps" / "dashboard.py"), default_timeout=300)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert [e.value for e in at.error] == [e.value for e in at.error if "has no tokenizer" in e.value] != []
    assert len(at.error) == 1 and "tokenizer.json" in at.error[0].value and not at.text_area
