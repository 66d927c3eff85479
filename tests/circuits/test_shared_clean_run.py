"""Discovery's setup records one clean forward for what three readers used to run apart: the senders' clean
activations, the first table's resumed patcher (block inputs, keys and values, ``hook_z``, logits) and the roles'
attention patterns. Each reader gets what its own forward gives, and the table runs no forward of its own."""

from __future__ import annotations

import pytest
import torch

from headlens.circuits.api import setup
from headlens.circuits.nodes import LOGITS, at_positions, make_edges
from headlens.circuits.roles import attention
from headlens.circuits.senders import _run
from headlens.readout.write import write_path
from tests.ioi_models import load_quietly, save_ioi_llama


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_quietly(save_ioi_llama(tmp_path_factory.mktemp("ioi") / "m"))


def test_setup_records_one_clean_forward_for_senders_patcher_and_roles(model):
    s = setup(model, "logit_diff", "mean", prompts="ioi", n_prompts=16, seed=3)
    assert s.clean_run is not None and s.patterns is not None
    own = _run(model, write_path(model).activations(), s.task.tokens, s.task.attention_mask)  # a forward of its own
    assert s.deltas.clean.keys() == own.keys()
    for key, x in own.items():
        torch.testing.assert_close(s.deltas.clean[key], x, rtol=0, atol=1e-6)

    calls = []
    handle = model.bridge.blocks[0].register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        edges = [e for e in make_edges(model, [LOGITS], None, ("resid",), strict=False) for e in at_positions(e, ["END"], None)]
        s.table(edges)
    finally:
        handle.remove()
    assert not calls  # the edges into the logits resume after the last block: the clean run is setup's
    (patcher,) = s.patchers.values()
    assert patcher.run is s.clean_run

    nodes = [("L1H0", "END"), ("L0H3", "S2")]
    recorded = attention(s, nodes)
    s.patterns = None  # the roles' own forward
    assert recorded.keys() == (fresh := attention(s, nodes)).keys()
    for node in nodes:
        assert recorded[node] == pytest.approx(fresh[node], abs=1e-6)
    s.done_patching()
    assert s.clean_run is None and not s.patchers


def test_an_encoder_takes_no_resumed_path(tmp_path):
    """Every resumed path runs a prompt from its first changed position on, which an encoder's earlier positions
    (reading its later ones) would not follow: a bidirectional bridge is never resumable, so its setup records no
    shared run and its edges take one forward each."""
    from hf_families import build

    import headlens
    from headlens.circuits.recorded import resumable

    model = headlens.load(f"hf:{build('bert', tmp_path / 'bert')}")
    assert not model.is_causal and not resumable(model)
    s = setup(model, "kl", "mean", prompts=["the cat sat on the mat", "a dog ran in the park"], n_prompts=2)
    assert s.clean_run is None and s.patterns is None
