"""Discovery and motifs: the planted circuit is found whole and nothing else; induction-2l's circuit and motif."""

from __future__ import annotations

import headlens
from headlens.circuits.edges import significant_mask
from headlens.circuits.motifs import motifs
from headlens.circuits.nodes import Node
from headlens.testing import PLANTED_EDGES, planted_circuit_model


def test_discovery_finds_the_planted_circuit_and_is_seeded():
    model = planted_circuit_model()
    a = headlens.circuit(model, method="mean", n_prompts=8, n_control=3, seed=1)
    b = headlens.circuit(model, method="mean", n_prompts=8, n_control=3, seed=1)
    assert a.equals(b) and a.attrs["faithfulness_curve"] == b.attrs["faithfulness_curve"]
    assert a.attrs["roots"] == ["L0H0", "L1H0"]  # the only heads whose ablation matters
    found = set(zip(a.sender, a.receiver, a.input, strict=True))
    assert set(PLANTED_EDGES) <= found
    assert not any(s.startswith("L0H") and s != "L0H0" for s in a.sender)  # zero-weight heads never appear
    assert significant_mask(a).all()
    assert a.attrs["faithfulness"] > 0.99  # the circuit's heads alone do the task


def test_induction_2l_discovery_and_the_induction_motif():
    df = headlens.circuit("induction-2l", method="zero", n_prompts=16)
    assert {"L0H0", "L1H1"} <= set(df.attrs["roots"])
    edges = set(zip(df.sender, df.receiver, df.input, strict=True))
    assert {("L0H0", "L1H1", "k"), ("L0H0", "L1H1", "q"), ("L0H2", "L1H1", "k")} <= edges
    table = motifs(df, {"L0H0": "previous_token", "L1H1": "induction"})
    assert list(zip(table.motif, table.sender, table.receiver, strict=True)) == [("induction circuit", "L0H0", "L1H1")]
    assert df.attrs["faithfulness"] > 0.9


def test_an_untrained_model_has_no_circuit_and_discovery_says_inconclusive(monkeypatch, capsys):
    """No evidence is no circuit: random weights move the loss by ~1e-7 nats, with CIs that exclude zero."""
    import torch
    from conftest import run_cli

    from headlens.models.checkpoint import save_checkpoint
    from headlens.models.gpt import GPT

    torch.manual_seed(0)
    trained = headlens.load("induction-2l")
    untrained = GPT(trained.cfg, tokenizer=trained.tokenizer).eval()
    untrained.name = "untrained"
    df = headlens.circuit(untrained, n_prompts=12, metric="repeated_loss")
    assert len(df) == 0 and df.attrs["verdict"] == "inconclusive" and "no circuit" in df.attrs["why"]
    assert headlens.circuit(trained, n_prompts=12, metric="repeated_loss").attrs["verdict"] == "found"

    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "untrained.safetensors"
    save_checkpoint(untrained, path)
    code, out, _ = run_cli(monkeypatch, capsys, "circuit", "-m", str(path), "--n-prompts", "12")
    assert code == 0 and out.startswith("inconclusive: no head's ablation moves repeated_loss")


def test_discovery_roots_in_one_head_layers_and_on_the_users_prompts():
    """A layer with one head has no other head for a control (compiled tracr models are like this): its head
    is a root when its CI clears the floor. And the sweep that picks the roots reads the user's prompts
    (a char-level model cannot take the default stdlib snippets)."""
    import torch

    from headlens.circuits.api import setup
    from headlens.circuits.discovery import heads_that_matter
    from headlens.models.config import ModelConfig
    from headlens.models.gpt import GPT
    from headlens.models.tokenizer import Tokenizer

    torch.manual_seed(0)
    tok = Tokenizer.char_level("abcdefgh")
    model = GPT(ModelConfig(n_layers=2, n_heads=1, d_model=16, n_ctx=12, d_vocab=tok.d_vocab, init_range=0.5), tok).eval()
    prompts = ["abcdefgh", "hgfedcba", "aabbccdd", "abcabcab", "ddccbbaa", "hahahaha"]
    s = setup(model, "kl", "mean", prompts=prompts, n_prompts=6, n_control=3, n_boot=200)
    assert heads_that_matter(s) == [Node("head", 0, 0), Node("head", 1, 0)]
    df = headlens.circuit(model, metric="kl", method="mean", prompts=prompts, n_prompts=6, n_boot=200)
    assert df.attrs["verdict"] == "found" and ("L0H0", "L1H0") in set(zip(df.sender, df.receiver, strict=True))


def test_heads_that_matter_with_no_edge_into_them_say_so():
    """Roots found, but the only senders allowed (a zero-weight head) feed nothing: inconclusive, naming the roots."""
    df = headlens.circuit(planted_circuit_model(), senders="L0H2", method="mean", n_prompts=8, n_control=3)
    assert len(df) == 0 and df.attrs["verdict"] == "inconclusive"
    assert df.attrs["why"].startswith("L0H0, L1H0 matter for repeated_loss, but no edge into their q, k or v")
