"""A circuit in the format the MIB circuit track reads: EAP-IG's graph JSON.

The Mechanistic Interpretability Benchmark's circuit track (Mueller et al. 2025, ``hannamw/MIB-circuit-track``)
loads circuits with the ``Graph`` class of EAP-IG (``hannamw/EAP-IG``, ``src/eap/graph.py``), whose
``Graph.to_json`` writes, and ``Graph.from_json`` reads, one JSON object::

    {"cfg": {"n_layers": 2, "n_heads": 4, "parallel_attn_mlp": false, "d_model": 64},
     "nodes": {"input": {"in_graph": true}, "a0.h0": {"in_graph": true}, ..., "m1": {"in_graph": false},
               "logits": {"in_graph": true}},
     "edges": {"input->a0.h0<q>": {"score": 0.12, "in_graph": false}, "a0.h0->a1.h0<k>": {...}, ...}}

Nodes, in the graph's order, are ``input`` (the embeddings), per layer ``a{layer}.h{head}`` then ``m{layer}``,
and ``logits`` (always in the graph); an edge is ``{parent}->{child}``, with ``<q>``, ``<k>`` or ``<v>``
appended when the child is an attention head. ``from_json`` builds the model's full graph from ``cfg``,
then reads each node's ``in_graph`` and each listed edge's ``score`` and ``in_graph``; an edge not listed
keeps score 0 and stays out. So headlens writes every edge it measured, with its effect as the score, and
no other (an unmeasured edge is absent, not claimed to be zero); ``in_graph`` marks the edges the edge
table calls significant (:func:`headlens.circuits.edges.significant_mask`), and a node is in the graph when
one of its in-graph edges touches it. An edge the full graph lacks (a later layer into an earlier one, an
attention head into the MLP of its own layer when attention and MLP run in parallel) and edges restricted
to positions have no place in the format and are refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from headlens.circuits.nodes import CircuitError
from headlens.models.files import write_text


def mib_node(name: str) -> str:
    """A headlens node name in EAP-IG's spelling.

    >>> [mib_node(n) for n in ("embed", "L0H3", "mlp1", "logits")]
    ['input', 'a0.h3', 'm1', 'logits']
    """
    if name in ("embed", "logits"):
        return "input" if name == "embed" else "logits"
    if name.startswith("mlp") and name[3:].isdigit():
        return f"m{int(name[3:])}"
    if name.startswith("L") and "H" in name:
        layer, head = name[1:].split("H", 1)
        return f"a{int(layer)}.h{int(head)}"
    raise CircuitError(f"edge node {name!r} has no MIB name; expected L{{l}}H{{h}}, embed, mlp{{l}} or logits")


def graph_nodes(n_layers: int, n_heads: int) -> list[str]:
    """EAP-IG's node names in its graph's order.

    >>> graph_nodes(1, 2)
    ['input', 'a0.h0', 'a0.h1', 'm0', 'logits']
    """
    layers = [[*(f"a{layer}.h{h}" for h in range(n_heads)), f"m{layer}"] for layer in range(n_layers)]
    return ["input", *(n for layer in layers for n in layer), "logits"]


def _order(node: str) -> tuple[int, int]:
    """Where ``node`` sits in the forward pass: (layer, 0 for attention, 1 for the MLP)."""
    if node in ("input", "logits"):
        return (-1, 1) if node == "input" else (1 << 30, 0)
    return (int(node[1:].split(".")[0]), 0 if node.startswith("a") else 1)


def mib_edge(parent: str, child: str, qkv: str, parallel: bool) -> str:
    """The EAP-IG name of the edge ``parent -> child`` (MIB node names) into input ``qkv`` of ``child``;
    ``CircuitError`` for an edge the full graph does not have.

    >>> mib_edge("a0.h1", "a1.h0", "k", False), mib_edge("m0", "logits", "resid", False)
    ('a0.h1->a1.h0<k>', 'm0->logits')
    """
    (pl, pk), (cl, ck) = _order(parent), _order(child)
    earlier = pl < cl or (pl == cl and pk < ck and not parallel)  # a layer's heads feed its MLP unless parallel
    if not earlier:
        raise CircuitError(f"edge {parent}->{child} is not an edge of EAP-IG's graph: a parent must come before "
                           f"its child in the forward pass")
    if child.startswith("a"):
        if qkv not in ("q", "k", "v"):
            raise CircuitError(f"edge {parent}->{child} enters an attention head through {qkv!r}; EAP-IG's graph "
                               f"has q, k and v")
        return f"{parent}->{child}<{qkv}>"
    return f"{parent}->{child}"


def mib_graph(edges: Any, model: Any) -> dict[str, Any]:
    """The EAP-IG graph dict of an edge table (``headlens.circuit``'s) measured on ``model``."""
    from headlens.circuits.edges import significant_mask

    for col in ("receiver_pos", "sender_pos"):
        if col in edges.columns and (edges[col].notna() & (edges[col] != "all")).any():
            raise CircuitError(f"the edge table has {col} values; MIB graphs have no positions: export a circuit "
                               f"measured over all positions (no --positions / sender positions)")
    cfg = getattr(model, "cfg", model)
    n_layers, n_heads = int(cfg.n_layers), int(cfg.n_heads)
    parallel = bool(getattr(getattr(getattr(model, "bridge", None), "cfg", None), "parallel_attn_mlp", False))
    touched = {"logits"}  # EAP-IG's logits node is always in the graph
    kept = significant_mask(edges) if len(edges) else []
    out: dict[str, dict[str, Any]] = {}
    for row, keep in zip(edges.itertuples(index=False), kept, strict=True):
        parent, child = mib_node(row.sender), mib_node(row.receiver)
        out[mib_edge(parent, child, row.input, parallel)] = {"score": float(row.effect), "in_graph": bool(keep)}
        if keep:
            touched |= {parent, child}
    return {"cfg": {"n_layers": n_layers, "n_heads": n_heads, "parallel_attn_mlp": parallel,
                    "d_model": int(cfg.d_model)},
            "nodes": {name: {"in_graph": name in touched} for name in graph_nodes(n_layers, n_heads)},
            "edges": out}


def write_mib(edges: Any, model: Any, path: str | os.PathLike) -> Path:
    """Write ``edges`` (an edge table of ``model``) as the MIB circuit track's graph JSON (module docstring).

    >>> df = headlens.circuit("induction-2l", receivers="L1H1", inputs="k")  # doctest: +SKIP
    >>> write_mib(df, model, "induction.mib.json")  # doctest: +SKIP
    """
    p = Path(path)
    write_text(p, json.dumps(mib_graph(edges, model), indent=1) + "\n")
    return p
