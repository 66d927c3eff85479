"""``headlens.attribute``: targets (a token, a contrast, the IOI metric, the model's prediction), positions,
the summary with bootstrap CIs, the CLI, and one-line refusals of what it cannot do."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headlens
from headlens.errors import ProbeError
from headlens.interventions.metrics import get_metric, make_task
from headlens.readout.dla import COLUMNS
from headlens.scoring.writers import SUMMARY_COLUMNS, attribution_summary, strongest
from tests.conftest import make_gpt, run_cli
from tests.ioi_models import load_quietly, save_ioi_llama

TEXTS = ["abc abd abe", "hello world"]


@pytest.fixture(scope="module")
def gpt():
    return make_gpt(1)


@pytest.fixture(scope="module")
def ioi_dir(tmp_path_factory):
    return save_ioi_llama(tmp_path_factory.mktemp("ioi") / "m")


def _by(df):
    return df.set_index(["prompt", "position", "component"]).attribution


def test_table_schema_and_components(gpt):
    df = headlens.attribute(gpt, TEXTS, target="d")
    assert tuple(df.columns) == COLUMNS and set(df.prompt) == {0, 1}
    assert df.position.tolist()[:1] == [len(TEXTS[0])]  # the last token (BOS first)
    heads = [f"L{layer}H{h}" for layer in range(2) for h in range(4)]
    assert list(df.component[:11]) == ["embed", *heads[:4], "mlp0", *heads[4:], "mlp1"][:11]
    assert df.component.iloc[-1] == "bias" and (df.target == "'d'").all()


def test_contrast_is_the_difference_of_two_targets(gpt):
    a = _by(headlens.attribute(gpt, TEXTS, target="d"))
    b = _by(headlens.attribute(gpt, TEXTS, target="e"))
    both = headlens.attribute(gpt, TEXTS, contrast="d,e")
    np.testing.assert_allclose(_by(both).to_numpy(), (a - b).to_numpy(), atol=1e-9)
    assert set(both.target) == {"'d' - 'e'"}


def test_default_target_is_the_prediction(gpt):
    df = headlens.attribute(gpt, TEXTS, position="all")
    with torch.no_grad():
        logits = [gpt(gpt.to_tokens(t))[0] for t in TEXTS]
    total = df.groupby(["prompt", "position"]).attribution.sum()
    for (b, t), value in total.items():
        assert value == pytest.approx(float(logits[b][t].max()), abs=1e-4)
    assert len(total) == sum(len(t) + 1 for t in TEXTS)


def test_positions(gpt):
    last = headlens.attribute(gpt, TEXTS, target="d", position=-1)
    assert _by(last).equals(_by(headlens.attribute(gpt, TEXTS, target="d")))
    assert set(headlens.attribute(gpt, TEXTS, target="d", position=2).position) == {2}
    with pytest.raises(ProbeError, match="outside a prompt"):
        headlens.attribute(gpt, TEXTS, target="d", position=40)
    with pytest.raises(ProbeError, match="unknown position 'S2'"):
        headlens.attribute(gpt, TEXTS, target="d", position="S2")


def test_refusals_are_one_line(gpt):
    with pytest.raises(ProbeError, match=r"'ab' is 2 tokens .*\['a', 'b'\]"):
        headlens.attribute(gpt, TEXTS, target="ab")
    with pytest.raises(ProbeError, match="not target and contrast"):
        headlens.attribute(gpt, TEXTS, target="a", contrast="a,b")
    with pytest.raises(ProbeError, match="reads the IOI prompts"):
        headlens.attribute(gpt, TEXTS, metric="logit_diff")


def test_ioi_logit_diff_matches_the_metric(ioi_dir):
    model = load_quietly(ioi_dir)
    df = headlens.attribute(model, "ioi", n_prompts=8, seed=4)  # metric logit_diff by default
    assert set(df.target) == {"IO - S"} and df.attrs["probe"] == "ioi"
    task = make_task(model, "logit_diff", "ioi", n_prompts=8, seed=4)
    with torch.no_grad():
        want = get_metric("logit_diff")(model(task.tokens, attention_mask=task.attention_mask), task)
    got = df.groupby("prompt").attribution.sum().to_numpy()
    np.testing.assert_allclose(got, want.numpy(), atol=1e-4)
    from headlens.probes.ioi import ioi_probe

    s2 = headlens.attribute(model, ioi_probe(model, 8, seed=4), position="S2")  # a probe object, a named position
    assert s2.groupby("prompt").position.first().tolist() == ioi_probe(model, 8, seed=4).positions["S2"].tolist()


def test_summary(gpt):
    df = headlens.attribute(gpt, ["abc abd", "abc abe", "xyz xyd", "hello"], target="d")
    s = attribution_summary(df, n_boot=200)
    assert tuple(s.columns) == SUMMARY_COLUMNS and len(s) == df.component.nunique()
    assert (s.ci_low <= s.attribution).all() and (s.attribution <= s.ci_high).all()
    assert s.share.sum() == pytest.approx(1.0) and s.attribution.is_monotonic_decreasing
    per_prompt = df.groupby("prompt").attribution.sum()
    assert s.attrs["total"]["mean"] == pytest.approx(per_prompt.mean())
    writers, suppressors = strongest(s, 3)
    assert (writers.attribution > 0).all() and (suppressors.attribution < 0).all()
    assert "bias" not in set(writers.component) | set(suppressors.component)
    assert s.loc[s.component == "L1H2", ["layer", "head"]].values.tolist() == [[1, 2]]


def test_cli(gpt, tmp_path, monkeypatch, capsys):
    from headlens.models.checkpoint import save_checkpoint
    from headlens.scoring.output import read_frame

    path = str(save_checkpoint(gpt, tmp_path / "m.safetensors"))
    out = tmp_path / "dla.csv"
    code, stdout, err = run_cli(monkeypatch, capsys, "attribute", "--model", path, "--prompt", "abc abd",
                                "--target", "d", "--out", str(out), "-q")
    assert code == 0, err
    assert "strongest writers" in stdout and "strongest suppressors" in stdout
    back = read_frame(out)
    assert tuple(back.columns) == COLUMNS and back.attrs["table"] == "direct logit attribution"
    code, _, err = run_cli(monkeypatch, capsys, "attribute", "--model", path, "--prompt", "abc", "--target", "ab")
    assert code == 5 and err.count("\n") == 1 and "2 tokens" in err
    code, _, err = run_cli(monkeypatch, capsys, "attribute", "--model", path)
    assert code == 2 and "--prompt TEXT or --prompts FILE" in err
