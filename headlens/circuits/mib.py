"""A circuit in the format the MIB circuit track reads: EAP-IG's graph JSON.

The Mechanistic Interpretability Benchmark's circuit track (Mueller et al. 2025, ``hannamw/MIB-circuit-track``)
loads circuits with the ``Graph`` class of EAP-IG (``hannamw/EAP-IG``, ``eap/graph.py``: ``Graph.from_json``),
which reads one JSON object::

    {"cfg": {"n_layers": 2, "n_heads": 4, "parallel_attn_mlp": false, "d_model": 64},
     "nodes": {"input": true, "a0.h1": true, "m0": false, ..., "logits": true},
     "edges": {"a0.h1->a1.h0<k>": {"score": 0.71, "in_graph": true}, "a1.h0->logits": {...}, ...}}

Nodes are ``input`` (the embeddings), ``a{layer}.h{head}``, ``m{layer}`` and ``logits``; an edge is
``{parent}->{child}``, with ``<q>``, ``<k>`` or ``<v>`` appended when the child is an attention head's input.
The benchmark ranks edges by ``score`` and cuts circuits of its own sizes from that ranking, so every edge
headlens measured is written with its effect as the score; ``in_graph`` marks the edges the edge table calls
significant (:func:`headlens.circuits.edges.significant_mask`), and a node is in the graph when one of its
in-graph edges touches it. Edges restricted to positions have no place in the format and are refused.
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
    nodes = {"input": False, **{f"a{layer}.h{h}": False for layer in range(n_layers) for h in range(n_heads)},
             **{f"m{layer}": False for layer in range(n_layers)}, "logits": False}
    kept = significant_mask(edges) if len(edges) else []
    out: dict[str, dict[str, Any]] = {}
    for row, keep in zip(edges.itertuples(index=False), kept, strict=True):
        parent, child = mib_node(row.sender), mib_node(row.receiver)
        name = f"{parent}->{child}" + (f"<{row.input}>" if child.startswith("a") else "")
        out[name] = {"score": float(row.effect), "in_graph": bool(keep)}
        if keep:
            nodes[parent] = nodes[child] = True
    return {"cfg": {"n_layers": n_layers, "n_heads": n_heads, "parallel_attn_mlp": parallel,
                    "d_model": int(cfg.d_model)}, "nodes": nodes, "edges": out}


def write_mib(edges: Any, model: Any, path: str | os.PathLike) -> Path:
    """Write ``edges`` (an edge table of ``model``) as the MIB circuit track's graph JSON (module docstring).

    >>> df = headlens.circuit("induction-2l", receivers="L1H1", inputs="k")  # doctest: +SKIP
    >>> write_mib(df, model, "induction.mib.json")  # doctest: +SKIP
    """
    p = Path(path)
    write_text(p, json.dumps(mib_graph(edges, model), indent=1) + "\n")
    return p
