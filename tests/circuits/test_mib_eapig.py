"""MIB export against EAP-IG itself: a graph JSON written by EAP-IG's own ``Graph.to_json``, and a reader that
does what its ``Graph.from_json`` does (hannamw/EAP-IG ``src/eap/graph.py``, HEAD 795f560).

``tests/data/mib/eapig_graph.json`` was written outside this project by EAP-IG's code: ``Graph.from_model`` of
the config below, the edge scores and ``in_graph`` flags of :data:`EDGES` set on it, each node put in the
graph when one of its in-graph edges touches it, then ``Graph.to_json`` (run with stub modules for the
``transformer_lens`` and ``matplotlib`` imports that building a graph from a dict config does not use); its
``Graph.from_json`` read the file back. None of EAP-IG's code is in this repository.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import headlens
from headlens.circuits.api import circuit
from headlens.testing import planted_circuit_model

FIXTURE = Path(__file__).parent.parent / "data" / "mib" / "eapig_graph.json"
# the edges set on EAP-IG's graph, in headlens' words (sender, receiver, input) -> (score, in_graph)
EDGES = {("embed", "L0H0", "q"): (0.03125, False), ("embed", "L1H0", "q"): (0.4375, True),
         ("embed", "L1H0", "v"): (0.875, True), ("L0H0", "L1H0", "k"): (0.9375, True),
         ("L0H2", "L1H0", "v"): (-0.00390625, False), ("L0H1", "mlp0", "resid"): (0.125, False),
         ("mlp0", "L1H3", "k"): (-0.25, True), ("L1H0", "logits", "resid"): (1.5, True),
         ("mlp1", "logits", "resid"): (0.0625, False)}


def eapig_edge_names(cfg: dict) -> list[str]:
    """Every edge of EAP-IG's full graph (``Graph.from_model``): each node on the residual stream so far
    into each head's q, k, v; with sequential attention and MLP, the layer's heads into its MLP too."""
    L, H, parallel = cfg["n_layers"], cfg["n_heads"], cfg["parallel_attn_mlp"]
    stream, names = ["input"], []
    for layer in range(L):
        heads = [f"a{layer}.h{h}" for h in range(H)]
        names += [f"{p}->{a}<{x}>" for p in stream for a in heads for x in "qkv"]
        if parallel:
            names += [f"{p}->m{layer}" for p in stream]
            stream += heads
        else:
            stream += heads
            names += [f"{p}->m{layer}" for p in stream]
        stream.append(f"m{layer}")
    return names + [f"{p}->logits" for p in stream]


def eapig_read(d: dict) -> tuple[dict[str, bool], dict[str, float], set[str]]:
    """What ``Graph.from_json`` makes of a graph dict: nodes' in_graph, every edge's score, the in-graph edges.

    As it does: the three keys must be there; the full graph comes from ``cfg``; nodes other than ``logits``
    are read as ``node_dict['in_graph']`` (a bare bool fails: ``'bool' object is not subscriptable``); each
    listed edge must be an edge of the graph (``g.edges[name]``, KeyError otherwise); unlisted edges keep
    score 0 and stay out; ``logits`` is always in the graph.
    """
    assert all(k in d for k in ("cfg", "nodes", "edges")), "Bad input JSON format - Missing keys"
    names = eapig_edge_names(d["cfg"])
    scores, kept = dict.fromkeys(names, 0.0), dict.fromkeys(names, False)
    nodes = {"logits": True}
    for name, node_dict in d["nodes"].items():
        if name == "logits":
            continue
        nodes[name] = bool(node_dict["in_graph"])
    for name, info in d["edges"].items():
        if name not in scores:
            raise KeyError(name)
        scores[name], kept[name] = float(info["score"]), bool(info["in_graph"])
    return nodes, scores, {n for n, k in kept.items() if k}


def _table(edges: dict) -> pd.DataFrame:
    rows = pd.DataFrame([{"sender": s, "receiver": r, "input": i, "effect": e} for (s, r, i), (e, _) in edges.items()])
    rows.attrs["metric"] = "repeated_loss"
    return rows


def test_export_is_what_eapig_to_json_writes(monkeypatch):
    """Same cfg, same node objects, every edge headlens writes spelled and valued as EAP-IG wrote it, and
    the edges it does not write are the ones EAP-IG holds at score 0, out of the graph."""
    import headlens.circuits.edges as edges_module
    from headlens.circuits.mib import mib_graph

    theirs = json.loads(FIXTURE.read_text())
    model = planted_circuit_model()
    assert theirs["cfg"]["d_model"] == model.cfg.d_model
    monkeypatch.setattr(edges_module, "significant_mask", lambda df: [k for _, k in EDGES.values()])
    ours = mib_graph(_table(EDGES), model)
    assert ours["cfg"] == theirs["cfg"]
    assert list(ours["nodes"].items()) == list(theirs["nodes"].items())  # the graph's order, objects, logits in
    for name, info in ours["edges"].items():
        assert theirs["edges"][name] == info
    assert all(info == {"score": 0.0, "in_graph": False} for name, info in theirs["edges"].items()
               if name not in ours["edges"])
    assert eapig_read(ours) == eapig_read(theirs)
    assert len(theirs["edges"]) == len(eapig_edge_names(theirs["cfg"]))  # the reader's graph is EAP-IG's graph


def test_the_reader_catches_a_bare_bool_node():
    """The old export wrote ``"a0.h1": true``: EAP-IG's reader fails on it, and so does this one."""
    old = {"cfg": {"n_layers": 1, "n_heads": 1, "parallel_attn_mlp": False, "d_model": 4},
           "nodes": {"input": True, "a0.h0": True, "m0": False, "logits": True}, "edges": {}}
    with pytest.raises(TypeError, match="not subscriptable"):
        eapig_read(old)


@pytest.mark.parametrize("inputs", ["qkv", "k"])
def test_every_export_loads_with_the_same_in_graph_edges_and_scores(tmp_path, inputs):
    """A circuit headlens measured, written and read back as EAP-IG reads it: each measured edge's score is
    its effect, the in-graph edges are the significant ones, nothing else is in the graph."""
    from headlens.circuits.edges import significant_mask
    from headlens.circuits.mib import mib_edge, mib_node

    model = planted_circuit_model()
    df = circuit(model, receivers="L1H0", inputs=inputs, method="zero", n_prompts=8, n_control=3)
    nodes, scores, in_graph = eapig_read(json.loads(headlens.write_mib(df, model, tmp_path / "c.json").read_text()))
    names = [mib_edge(mib_node(r.sender), mib_node(r.receiver), r.input, False) for r in df.itertuples()]
    assert {n: scores[n] for n in names} == dict(zip(names, df["effect"].astype(float), strict=True))
    assert in_graph == {n for n, keep in zip(names, significant_mask(df), strict=True) if keep} != set()
    assert all(nodes[e.split("->")[0]] for e in in_graph) and nodes["logits"]
