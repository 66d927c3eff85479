"""Discovery at named positions on a planted IOI model: a Llama whose head L1H0 attends from END to
IO and copies it (a name mover) and L1H2 copies it negatively (a negative name mover); both are found as
roots at END with their roles, the name reaches the mover through its value at IO, and the circuit is
faithful by every measure."""

from __future__ import annotations

import math

import pytest

import headlens
from headlens.probes.ioi import ioi_probe
from tests.ioi_models import load_quietly, save_planted_llama


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    heads = {(1, 0): (12, 4.0), (1, 2): (12, -3.0)}  # template 0, ABBA: IO is 12 tokens before END; L1H2 writes
    # a share of the answer above positional.ROOT_SHARE (at -1.5 it wrote 2 % of L1H0's effect and was no root)
    return load_quietly(save_planted_llama(tmp_path_factory.mktemp("ioi") / "m", heads))


@pytest.fixture(scope="module")
def discovered(planted):
    probe = ioi_probe(planted, 16, templates=[0], orders=["ABBA"])
    return headlens.circuit(planted, prompts=probe, metric="logit_diff", method="mean", n_prompts=16, n_control=3)


def test_the_planted_ioi_circuit_is_found_at_its_positions(discovered):
    df = discovered
    assert df.attrs["verdict"] == "found" and df.attrs["read_position"] == "END"
    assert df.attrs["roots"] == ["L1H0@END", "L1H2@END"]
    assert df.attrs["roles"]["L1H0@END"] == "name mover" and df.attrs["roles"]["L1H2@END"] == "negative name mover"
    edges = set(df[["sender", "receiver", "input", "receiver_pos", "sender_pos"]].itertuples(index=False, name=None))
    assert ("embed", "L1H0", "v", "END", "IO") in edges  # the name it copies, read at IO
    assert not any(s.startswith("L0") for s in df.sender)  # layer 0's heads do nothing for the task
    mover = df[(df.sender == "L1H0") & (df.receiver == "logits")].iloc[0]
    assert mover.effect < -20 and mover.ci_high < mover.control_ci_low
    assert df.attrs["faithfulness"] > 0.95
    ioi = df.attrs["ioi_faithfulness"]
    assert ioi["abs_diff"] < 0.05 * ioi["F_M"] and abs(ioi["ratio"] - 1) < 0.05
    mib = df.attrs["mib"]
    assert len(mib["faithfulness"]) == 10 and mib["cpr"] > 0.9 and mib["cmd"] < 0.1
    fp = df.attrs["first_pass"]
    assert fp["kept"] < fp["candidates"]  # the gradient first pass chose what to patch


def test_the_report_draws_the_circuit_by_position_with_roles_and_faithfulness(planted, discovered):
    from headlens.viz.report import report_html

    table = headlens.classify(planted, detectors="previous_token", n_prompts=8, seq_len=16, n_boot=20)
    page = report_html(planted, table, prompt="When Mary and John went to the store, John gave a drink to",
                       edges=discovered)
    section = page[page.index("<h2>Circuit</h2>"):]
    assert "<td>L1H0@END</td><td>name mover</td>" in section
    assert "<td>L1H2@END</td><td>negative name mover</td>" in section
    assert "<th>sender_pos</th><th>receiver_pos</th>" in section  # the table says where each edge acts
    assert "<td>embed</td><td>L1H0</td><td>0</td><td>v</td><td>IO</td><td>END</td>" in section  # read at IO, acts at END
    assert f"MIB CPR {discovered.attrs['mib']['cpr']:.3f}" in section


def test_a_random_model_shows_no_ioi_circuit(tmp_path):
    from tests.ioi_models import save_ioi_llama

    model = load_quietly(save_ioi_llama(tmp_path / "random"))
    df = headlens.circuit(model, prompts="ioi", metric="logit_diff", n_prompts=16, n_control=3)
    assert len(df) == 0 and df.attrs["verdict"] == "inconclusive" and "logits at END" in df.attrs["why"]
    assert math.isnan(df.attrs["faithfulness"])


def test_every_phase_of_a_discovery_says_what_it_does_and_counts_to_its_total(planted):
    """The progress display's contract: each stage names itself and its steps add up to its total, so the bar
    never sits at a finished round's 100 % while the first pass, faithfulness or the check run."""
    events: list[tuple] = []
    probe = ioi_probe(planted, 16, templates=[0], orders=["ABBA"])
    headlens.circuit(planted, prompts=probe, metric="logit_diff", method="mean", n_prompts=16, n_control=3,
                     first_pass=4, stage=lambda what, total, done: events.append(("stage", what, total, done)),
                     progress=lambda n: events.append(("step", n)))
    stages: list[list] = []
    for e in events:
        if e[0] == "stage":
            stages.append([e[1], e[2], e[3]])
        else:
            stages[-1][2] += e[1]
    names = [what for what, _, _ in stages]
    assert names[0] == "discovery: patching the edges into the logits at END"
    assert any(n.startswith("discovery round 1 (at most") and "ranking" in n and "first pass" in n for n in names)
    assert any(n.startswith("discovery round 1 (at most") and n.endswith("edges and their controls") for n in names)
    assert names[-2].startswith("faithfulness: the model run with only each of") and names[-1].startswith("run-time check: 2 edges")
    for what, total, done in stages:
        assert done == total, (what, done, total)  # every step counted once, none past the end


def test_an_inconclusive_discovery_shows_no_empty_stage(tmp_path):
    """A random-weight model has no circuit: discovery says inconclusive, and its progress shows no stage with
    nothing to do (no run-time check of 0 edges)."""
    from tests.ioi_models import save_ioi_llama

    model = load_quietly(save_ioi_llama(tmp_path / "m", num_key_value_heads=1))  # MQA: one key/value head
    stages: list[tuple] = []
    df = headlens.circuit(model, prompts=ioi_probe(model, 12), metric="logit_diff", n_prompts=12, n_control=2,
                          stage=lambda what, total, done: stages.append((what, total)))
    assert df.attrs["verdict"] == "inconclusive" and df.attrs["why"]
    assert stages and all(total > 0 for _, total in stages), stages
    assert not any(what.startswith("run-time check") for what, _ in stages)
