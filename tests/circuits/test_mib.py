"""MIB export: the planted circuit as EAP-IG's graph JSON, names spelled as EAP-IG spells them (written out here
by hand, not by the code under test), its known edges in the graph and its known zeros out."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import headlens
from headlens.circuits.api import circuit
from headlens.circuits.nodes import CircuitError
from headlens.testing import PLANTED_EDGES, PLANTED_ZERO_EDGES, planted_circuit_model

# EAP-IG (hannamw/EAP-IG, eap/graph.py): node names and "<parent>-><child>[<qkv>]" edge names
NAMES = {("L0H0", "L1H0", "k"): "a0.h0->a1.h0<k>", ("embed", "L1H0", "q"): "input->a1.h0<q>",
         ("embed", "L1H0", "v"): "input->a1.h0<v>", ("L0H2", "L1H0", "v"): "a0.h2->a1.h0<v>"}


def test_planted_circuit_exports_as_an_eap_ig_graph(tmp_path):
    model = planted_circuit_model()
    df = circuit(model, receivers="L1H0", inputs="qkv", method="zero", n_prompts=8, n_control=3)
    graph = json.loads(headlens.write_mib(df, model, tmp_path / "planted.json").read_text())
    assert graph["cfg"] == {"n_layers": 2, "n_heads": 4, "parallel_attn_mlp": False, "d_model": model.cfg.d_model}
    assert set(graph["nodes"]) == {"input", "logits", "m0", "m1", *(f"a{i}.h{h}" for i in (0, 1) for h in range(4))}
    assert len(graph["edges"]) == len(df)
    for edge in PLANTED_EDGES:
        assert graph["edges"][NAMES[edge]]["in_graph"] and graph["edges"][NAMES[edge]]["score"] > 0.5
    assert not graph["edges"][NAMES["L0H2", "L1H0", "v"]]["in_graph"]
    assert ("L0H2", "L1H0", "v") in PLANTED_ZERO_EDGES
    assert {n for n, node in graph["nodes"].items() if node["in_graph"]} == {"input", "a0.h0", "a1.h0", "logits"}


def test_logit_and_mlp_names_and_positions_refused():
    from headlens.circuits.mib import mib_graph

    model = planted_circuit_model()
    rows = pd.DataFrame({"sender": ["mlp0", "L1H0"], "receiver": ["logits", "logits"], "input": ["resid", "resid"],
                         "effect": [0.1, 0.2], "receiver_pos": [None, None], "sender_pos": [None, None]})
    rows.attrs["metric"] = "repeated_loss"
    for col in ("ci_low", "ci_high", "control", "control_ci_low", "control_ci_high"):
        rows[col] = float("nan")
    assert set(mib_graph(rows, model)["edges"]) == {"m0->logits", "a1.h0->logits"}
    with pytest.raises(CircuitError, match="positions"):
        mib_graph(rows.assign(receiver_pos=["END", "END"]), model)
