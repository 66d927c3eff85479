"""Senders, receivers and edges: their names, their order in the forward pass, and which edges exist.

Names follow the edge table: heads ``L{layer}H{head}``, the token (and position) embedding ``embed``,
MLP outputs ``mlp{layer}``, and the unembedding ``logits``. A sender must run before its receiver:
a head of layer ``l`` reads the residual stream before layer ``l``, so only ``embed``, heads of layers
``< l`` and ``mlp{j}`` for ``j < l`` can send to it; the logits read everything.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from headlens.errors import HeadlensError

INPUTS = ("q", "k", "v")
_HEAD = re.compile(r"^L(\d+)H(\d+)$", re.IGNORECASE)
_MLP = re.compile(r"^mlp(\d+)$", re.IGNORECASE)


class CircuitError(HeadlensError, ValueError):
    """Bad circuit input: an unknown sender or receiver, an edge against the forward's order, a bad input."""

    exit_code = 2


@dataclass(frozen=True, order=True)
class Node:
    """One sender or receiver. ``kind`` is ``"embed"``, ``"head"``, ``"mlp"`` or ``"logits"``."""

    kind: str
    layer: int = -1
    head: int = -1

    @property
    def name(self) -> str:
        """``embed``, ``L1H2``, ``mlp0`` or ``logits``."""
        if self.kind == "head":
            return f"L{self.layer}H{self.head}"
        if self.kind == "mlp":
            return f"mlp{self.layer}"
        return self.kind

    def reads_after(self, sender: Node) -> bool:
        """True when ``sender``'s output reaches this receiver's input through the residual stream."""
        if self.kind == "logits" or sender.kind == "embed":
            return self.kind != "embed"
        if self.kind == "head":
            return sender.kind in ("head", "mlp") and sender.layer < self.layer
        return False

    def __str__(self) -> str:
        return self.name


EMBED, LOGITS = Node("embed"), Node("logits")


@dataclass(frozen=True, order=True)
class Edge:
    """Sender -> receiver's ``input`` (``q|k|v``; ``resid`` for the logits).

    ``group``: a key/value edge per group of a grouped-query model (every query head of the receiver's
    key/value head reads the patched key or value); False: only the receiver head reads it.
    ``pos`` / ``sender_pos``: the receiver's query positions and the sender's write positions the edge is
    restricted to (a name the probe gives, or ``all``; :mod:`headlens.circuits.positions`).
    """

    sender: Node
    receiver: Node
    input: str
    group: bool = False
    pos: str = "all"
    sender_pos: str = "all"

    @property
    def name(self) -> str:
        """``L0H0->L1H0.k``, with positions where restricted: ``L0H0@S1+1->L1H0.k@S2``."""
        s = self.sender.name if self.sender_pos == "all" else f"{self.sender}@{self.sender_pos}"
        r = f"{self.receiver}.{self.input}" if self.pos == "all" else f"{self.receiver}.{self.input}@{self.pos}"
        return f"{s}->{r}"

    def at(self, pos: str, sender_pos: str) -> Edge:
        """The same edge at other positions."""
        return Edge(self.sender, self.receiver, self.input, self.group, pos, sender_pos)


def n_kv_heads(model: Any) -> int:
    return int(getattr(model.cfg, "n_kv_heads", 0) or model.cfg.n_heads)


def kv_head(model: Any, head: int) -> int:
    """The key/value head query head ``head`` reads (itself without grouped-query attention)."""
    return head // (model.cfg.n_heads // n_kv_heads(model))


def has_mlp(model: Any) -> bool:
    return not getattr(model.cfg, "attn_only", False)


def parse_node(name: str, model: Any) -> Node:
    """A sender or receiver name for ``model``; ``CircuitError`` naming what was expected.

    >>> from types import SimpleNamespace as NS
    >>> parse_node("L1H0", NS(cfg=NS(n_layers=2, n_heads=4, attn_only=True))).name
    'L1H0'
    """
    s = name.strip()
    L, H = model.cfg.n_layers, model.cfg.n_heads
    if s.lower() in ("embed", "logits"):
        return Node(s.lower())
    if m := _HEAD.match(s):
        layer, head = int(m.group(1)), int(m.group(2))
        if layer < L and head < H:
            return Node("head", layer, head)
        raise CircuitError(f"head {s!r} is out of range; this model has layers 0..{L - 1} and heads 0..{H - 1}")
    if m := _MLP.match(s):
        layer = int(m.group(1))
        if not has_mlp(model):
            raise CircuitError(f"{s!r}: this model is attention-only, it has no MLPs")
        if layer < L:
            return Node("mlp", layer)
        raise CircuitError(f"{s!r} is out of range; this model has layers 0..{L - 1}")
    raise CircuitError(f"unknown node {s!r}; expected L<layer>H<head>, embed, mlp<layer> or logits")


def parse_nodes(spec: str | Sequence[str] | None, model: Any) -> list[Node] | None:
    """Comma-separated names (or a list) -> nodes, duplicates dropped; None stays None."""
    if spec is None:
        return None
    items = [s for s in spec.split(",") if s.strip()] if isinstance(spec, str) else list(spec)
    nodes = [n if isinstance(n, Node) else parse_node(str(n), model) for n in items]
    if not nodes:
        raise CircuitError(f"no nodes given in {spec!r}; expected e.g. 'L1H0,L1H1'")
    return list(dict.fromkeys(nodes))


def all_senders(model: Any) -> list[Node]:
    """``embed``, every head and every MLP, in forward order."""
    out = [EMBED]
    for layer in range(model.cfg.n_layers):
        out += [Node("head", layer, h) for h in range(model.cfg.n_heads)]
        if has_mlp(model):
            out.append(Node("mlp", layer))
    return out


def parse_inputs(spec: str) -> tuple[str, ...]:
    """``"qkv"``, ``"k"`` or ``"q,k"`` -> the inputs, in q, k, v order."""
    chars = {c for c in spec.replace(",", "").strip().lower()}
    if not chars or not chars <= set(INPUTS):
        raise CircuitError(f"unknown receiver inputs {spec!r}; expected letters of 'qkv', e.g. 'qk'")
    return tuple(c for c in INPUTS if c in chars)


def make_edges(model: Any, receivers: Sequence[Node], senders: Sequence[Node] | None, inputs: Sequence[str],
               per_group: bool = False, strict: bool = True, positions: Sequence[str] | None = None,
               sender_positions: Sequence[str] | None = None) -> list[Edge]:
    """Every valid (sender, receiver, input) edge, receivers first, senders in the order given.

    ``strict``: a named sender that can feed none of the receivers (it runs after, or with, every one of
    them) is an error; pairs where it runs after one receiver but before another are skipped.
    ``per_group``: key/value edges once per key/value group (the group's first query head names the
    receiver) instead of once per query head.
    ``positions`` / ``sender_positions``: receiver and sender positions (names, or ``all``); one edge per
    combination. A query and the logits read their own position, so there the sender position is the
    receiver's (:func:`at_positions`).
    """
    edges: dict[Edge, None] = {}
    grouped = per_group and n_kv_heads(model) < model.cfg.n_heads
    pool = senders if senders is not None else all_senders(model)
    if strict and senders is not None:
        for s in pool:
            if not any(r.reads_after(s) for r in receivers):
                late = ", ".join(r.name for r in receivers)
                raise CircuitError(f"sender {s} runs after (or with) receiver {late}: {s} cannot feed their inputs")
    for r in receivers:
        for s in pool:
            if not r.reads_after(s):
                continue
            for c in (("resid",) if r.kind == "logits" else inputs):
                if grouped and c in ("k", "v"):  # the group's edge, named by its first query head
                    e = Edge(s, Node("head", r.layer, _first_of_group(model, r.head)), c, True)
                else:
                    e = Edge(s, r, c)
                for p in at_positions(e, positions, sender_positions):
                    edges[p] = None
    return list(edges)


def at_positions(edge: Edge, positions: Sequence[str] | None, sender_positions: Sequence[str] | None) -> list[Edge]:
    """``edge`` at each (receiver position, sender position) pair. A ``q`` (or ``resid``) input reads the
    residual stream at its own query position: its sender position is its receiver position (with only
    sender positions given, each names both).

    >>> e = Edge(Node("head", 0, 0), Node("head", 1, 0), "q")
    >>> [x.name for x in at_positions(e, ["END"], ["S2"])]
    ['L0H0@END->L1H0.q@END']
    """
    rps, sps = list(positions or ["all"]), list(sender_positions or ["all"])
    if edge.input in ("q", "resid"):
        pairs = [(rp, rp) for rp in rps if rp != "all"]
        if "all" in rps:
            pairs += [(sp, sp) for sp in sps]
    else:
        pairs = [(rp, sp) for rp in rps for sp in sps]
    return [edge.at(rp, sp) for rp, sp in dict.fromkeys(pairs)]


def _first_of_group(model: Any, head: int) -> int:
    size = model.cfg.n_heads // n_kv_heads(model)
    return head - head % size
