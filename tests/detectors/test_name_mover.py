"""name_mover / negative_name_mover on planted heads: a Llama whose heads attend a fixed number of tokens back
(RoPE through constant q/k biases) and copy the name they read into the logits with a chosen sign.

On one-order IOI prompts (ABBA, one template: IO, S2 and END at fixed positions) a head 12 tokens back from
END reads IO: copying it makes a name mover, copying it negatively a negative name mover; a head 4 back reads
S2: copying S (against IO - S, but for the name it reads) makes neither, suppressing S (for IO - S, against
the name it reads) a negative name mover; a head that attends IO and writes nothing passes the pattern rule
and fails the gate. On the balanced probe a positional head cannot be a name mover; one that suppresses what it
reads is still a negative name mover."""

from __future__ import annotations

import pytest

import headlens
from headlens.errors import ProbeError
from headlens.probes.ioi import ioi_probe
from headlens.scoring import classification
from tests.ioi_models import load_quietly, save_planted_llama

DETS = ["name_mover", "negative_name_mover"]
END_TO_IO, END_TO_S2 = 12, 4  # template 0, ABBA: BOS When IO and S went to the PLACE , S2 gave a OBJECT to


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    heads = {(1, 0): (END_TO_IO, 4.0), (1, 2): (END_TO_IO, -4.0), (0, 0): (END_TO_S2, 4.0), (0, 2): (END_TO_S2, -4.0)}
    return load_quietly(save_planted_llama(tmp_path_factory.mktemp("nm") / "m", heads))


@pytest.fixture
def one_order(monkeypatch):
    """classify's IOI probe restricted to ABBA prompts of template 0 (so the plant's offsets hit IO)."""
    monkeypatch.setattr(classification, "ioi_scan_probe",
                        lambda model, n, seq_len, gen: ioi_probe(model, n, templates=[0], orders=["ABBA"]))


def _labelled(df):
    return {(d, f"L{layer}H{h}") for d, layer, h in df[df.label][["detector", "layer", "head"]].itertuples(index=False)}


def test_planted_movers_are_found(planted, one_order):
    df = headlens.classify(planted, detectors=DETS, n_prompts=16, n_boot=200)
    assert _labelled(df) == {("name_mover", "L1H0"), ("negative_name_mover", "L1H2"), ("negative_name_mover", "L0H2")}
    row = df[(df.detector == "name_mover") & (df.layer == 1) & (df["head"] == 0)].iloc[0]
    assert row.score > 0.9 and row.lift > 3 and row.dla_ci_low > 0
    copier = df[(df.detector == "negative_name_mover") & (df.layer == 0) & (df["head"] == 0)].iloc[0]
    assert copier.score > 0.9 and copier.dla_ci_low > 0  # attends S2 and writes S: for the name it reads
    nm = df[(df.detector == "name_mover") & (df.layer == 0) & (df["head"] == 0)].iloc[0]
    assert nm.dla_ci_high < 0 and nm.score < 0.01  # against IO - S, but no eye on IO: no name mover either
    import io

    from rich.console import Console

    from headlens.cli.classify import print_results

    out = io.StringIO()
    print_results(df, Console(file=out, width=220))
    assert "DLA (95% CI)" in out.getvalue() and f"{row.dla:+.3f}" in out.getvalue()  # the CLI shows the gate


def test_a_head_that_attends_io_and_writes_nothing_fails_the_gate(tmp_path, one_order):
    silent = load_quietly(save_planted_llama(tmp_path / "silent", {(1, 0): (END_TO_IO, 0.0)}))
    df = headlens.classify(silent, detectors=DETS, n_prompts=16, n_boot=200)
    row = df[(df.detector == "name_mover") & (df.layer == 1) & (df["head"] == 0)].iloc[0]
    assert (row.ci_low - row.baseline) / (1 - row.baseline) >= 0.4  # the pattern rule alone would label it
    assert not df.label.any()


def test_a_positional_head_is_no_name_mover_on_the_balanced_probe(planted):
    df = headlens.classify(planted, detectors=DETS, n_prompts=24, n_boot=200)
    # the heads that suppress what they read still read a name on many prompts and write against it: negative name
    # movers by the rule against the type's null, the one 4 back (0.56 of its attention, 3.2x its null; the old
    # fixed 0.4 on ci_low missed it) and the one 12 back (0.41, 2.3x: the lift floor of 3 missed it)
    assert _labelled(df) == {("negative_name_mover", "L0H2"), ("negative_name_mover", "L1H2")}
    assert df.attrs["thresholds"]["name_mover"] is None  # labelled against its null, no absolute threshold
    row = df[(df.detector == "name_mover") & (df.layer == 1) & (df["head"] == 0)].iloc[0]
    assert row.dla_ci_low < 0 < row.dla_ci_high  # IO in ABBA, S in BABA: it writes both ways


def test_gate_columns_only_on_gated_rows(planted):
    df = headlens.classify(planted, detectors=["previous_token", "name_mover"], n_prompts=8, seq_len=16, n_boot=50)
    assert df[df.detector == "previous_token"].dla.isna().all()
    assert df[df.detector == "name_mover"].dla.notna().all()


def test_models_without_single_token_names(tiny_gpt):
    df = headlens.classify(tiny_gpt, n_prompts=4, seq_len=16, n_boot=20)
    assert "name_mover" not in set(df.detector)
    assert "keeps 0 of" in df.attrs["skipped"]["name_mover"]
    with pytest.raises(ProbeError, match="one token with a leading space"):
        headlens.classify(tiny_gpt, detectors=["name_mover"], n_prompts=4)


def test_listed(monkeypatch, capsys):
    from headlens.cli.detectors import rows

    found = {r["name"]: r for r in rows()}
    assert found["name_mover"]["mark"] == "NM" and found["name_mover"]["probe"] == "ioi"
    assert "dla's CI below 0" in found["negative_name_mover"]["description"]


def test_copy_suppression_needs_the_attention_and_the_ov_claim(planted, one_order):
    """``copy_suppression`` (headlens.scoring.derived) is the negative name movers that ``ov_suppression``
    labels too: each row is the negative name mover's, with the label of both claims."""
    df = headlens.classify(planted, detectors=[*DETS, "ov_suppression", "ov_copying"], n_prompts=16, n_boot=200)
    labelled = _labelled(df)
    ov = {h for d, h in labelled if d == "ov_suppression"}
    negative = {h for d, h in labelled if d == "negative_name_mover"}
    assert ov and negative  # both claims occur on the plant
    assert {h for d, h in labelled if d == "copy_suppression"} == ov & negative
    nnm, cs = (df[df.detector == d].reset_index(drop=True) for d in ("negative_name_mover", "copy_suppression"))
    assert cs[["layer", "head", "score", "ci_low", "dla"]].equals(nnm[["layer", "head", "score", "ci_low", "dla"]])
    assert "copy_suppression_rule" in df.attrs
    from headlens.scoring.derived import with_copy_suppression

    one = df[df.detector != "copy_suppression"].copy()  # the OV claim withdrawn from one head: its label goes
    one.loc[(one.detector == "ov_suppression") & (one.layer == 1) & (one["head"] == 2), "label"] = False
    assert {h for d, h in _labelled(with_copy_suppression(one)) if d == "copy_suppression"} == ov & negative - {"L1H2"}


def test_both_gates_read_one_forward_per_batch(planted):
    """The negative gate's attention rows at END ride on the name mover gate's forwards: the same rows as the
    model's own ``hook_pattern`` read whole (run_with_cache, one prompt at a time), the same attributions as the
    gate alone, and no forward beyond the gate's."""
    import torch

    from headlens.detectors.name_mover import dla_against_attended, dla_io_minus_s
    from headlens.models.reads import TokenLedger
    from headlens.readout.dla import head_attributions

    probe = ioi_probe(planted, 20, seed=3)  # ragged: templates of different lengths in one batch
    ledger, cache = TokenLedger(planted), {}
    with ledger("gates"):
        against = dla_against_attended(planted, probe, cache)
        alone = dla_io_minus_s(planted, probe, cache)
    lengths = [len(t) for t in probe.prompts]
    assert ledger.read["gates"] == 16 * max(lengths[:16]) + 4 * max(lengths[16:])  # the gate's forwards, no more
    assert torch.equal(alone, head_attributions(planted, probe))
    rows = cache[("end reads", id(probe))][1]  # (P, L, H, T)
    T = max(len(t) for t in probe.prompts)
    for p, tokens in enumerate(probe.prompts):
        _, run = planted.run_with_cache(tokens[None], names_filter=lambda n: n.endswith("attn.hook_pattern"))
        end = int(probe.positions["END"][p])
        want = torch.stack([run[f"blocks.{layer}.attn.hook_pattern"][0, :, end] for layer in range(planted.n_layers)])
        torch.testing.assert_close(rows[p, :, :, :len(tokens)], want, atol=1e-6, rtol=0)
        assert not rows[p, :, :, len(tokens):T].any()  # keys past the prompt's end are 0
    p = torch.arange(len(probe))
    io = rows[p, :, :, probe.positions["IO"]]
    s = rows[p, :, :, probe.positions["S1"]] + rows[p, :, :, probe.positions["S2"]]
    assert torch.equal(against, torch.where(io >= s, 1.0, -1.0).double() * alone)
