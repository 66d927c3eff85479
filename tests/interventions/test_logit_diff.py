"""``logit_diff`` (IO − S at END) on IOI prompts: equal to plain transformers, taken by sweep, circuit and the
CLI through ``prompts="ioi"`` / ``--prompts ioi``, and refused on prompts that carry no answers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headlens.errors import ProbeError
from headlens.interventions.metrics import get_metric, ioi_task, make_task
from headlens.probes.ioi import ioi_probe
from tests.conftest import run_cli
from tests.ioi_models import load_quietly, save_ioi_llama


@pytest.fixture(scope="module")
def word_dir(tmp_path_factory):
    return save_ioi_llama(tmp_path_factory.mktemp("ioi") / "m")


@pytest.fixture(scope="module")
def word_model(word_dir):
    return load_quietly(word_dir)


def test_equals_plain_transformers(word_model, word_dir):
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(word_dir, attn_implementation="eager").eval()
    task = make_task(word_model, "logit_diff", "ioi", n_prompts=10, seed=2)
    probe = ioi_probe(word_model, 10, seed=2)
    with torch.no_grad():
        ours = get_metric("logit_diff")(word_model(task.tokens, attention_mask=task.attention_mask), task)
        want = [float(hf(p[None]).logits[0, -1, io] - hf(p[None]).logits[0, -1, s])  # one prompt, unpadded
                for p, (io, s) in zip(probe.prompts, probe.answers.tolist(), strict=True)]
    np.testing.assert_allclose(ours.numpy(), want, atol=1e-4)


def test_task_reads_end_and_keeps_answers_when_sliced(word_model):
    probe = ioi_probe(word_model, 6)
    task = ioi_task(word_model, probe)
    assert task.positions.sum(1).tolist() == [1] * 6
    assert task.positions.float().argmax(1).tolist() == probe.positions["END"].tolist()
    part = task.rows(slice(2, 5))
    assert torch.equal(part.answers, probe.answers[2:5]) and part.tokens.shape[0] == 3
    bad = ioi_task(word_model, probe, corrupted=True)
    assert bad.tokens.shape == task.tokens.shape and torch.equal(bad.answers, task.answers)


def test_needs_ioi_prompts(word_model):
    with pytest.raises(ProbeError, match="reads IOI prompts"):
        make_task(word_model, "logit_diff", ["When Mary and John went to the store, John gave a drink to"])
    kl = make_task(word_model, "kl", "ioi", n_prompts=4)  # other metrics read the probe's texts
    assert kl.tokens.shape[0] == 4


def test_sweep_and_circuit_take_it(word_model):
    import headlens

    df = headlens.sweep(word_model, groups=["L1H0"], metrics=["logit_diff"], prompts="ioi", n_prompts=8,
                        n_control=2, n_boot=50)
    task = make_task(word_model, "logit_diff", "ioi", n_prompts=8)
    with torch.no_grad():
        clean = get_metric("logit_diff")(word_model(task.tokens, attention_mask=task.attention_mask), task)
    assert df.clean.iloc[0] == pytest.approx(float(clean.mean()), abs=1e-5)
    assert df.attribution.notna().all()  # differentiable: attribution patching estimates it
    edges = headlens.circuit(word_model, receivers="logits", senders="L1H0,L1H1", metric="logit_diff", method="mean",
                             prompts="ioi", n_prompts=8, n_control=1, n_boot=50)
    assert edges.attrs["clean"] == pytest.approx(float(clean.mean()), abs=1e-5)


def test_cli(word_dir, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "ablate", "--model", f"hf:{word_dir}", "--heads", "L1H0",
                             "--metric", "logit_diff", "--prompts", "ioi", "--n-prompts", "6", "--n-control", "1", "-q")
    assert code == 0, err
    assert "logit_diff" in out
