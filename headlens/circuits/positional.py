"""Discovery at named positions: the circuit of a task whose prompts name positions, followed through them.

IOI (Wang et al. 2022) is the case it is built for: name movers at END copy the indirect object; the
S-inhibition heads at END tell them, through their queries, which name not to copy; induction and
duplicate-token heads at S2 feed the S-inhibition heads; previous-token heads at S1+1 feed the induction
heads' keys. With ``logit_diff`` read at END:

1. **Roots**: every sender's edge into the logits at the read position (END), measured exactly (cheap: the
   final norm and unembedding). A head whose edge is significant on either side, and at least
   :data:`ROOT_SHARE` of the strongest head's, is a root at END: a positive writer of the answer (its
   ablation lowers the metric) or a negative one (it raises it).
2. **Rounds**: every edge into a node's q at its own position and into its k and v at each named position
   up to it (``receiver_pos`` the node's position, ``sender_pos`` the key position), ranked by the gradient
   first pass (:mod:`~headlens.circuits.attribution`, restricted to those positions; ``first_pass``, default
   :data:`FIRST_PASS`) and the top candidates measured exactly with their controls. A significant edge's
   head sender becomes a node at its ``sender_pos``, and the next round starts from the new nodes.
3. Roles (:mod:`~headlens.circuits.roles`) and faithfulness (:mod:`~headlens.circuits.faithfulness`).

Every reported edge is an exact patch with its CI and control; significance is two-sided here (a negative
name mover's inputs matter with the opposite sign).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from headlens.circuits.edges import significant_mask
from headlens.circuits.nodes import LOGITS, Node, at_positions, make_edges

FIRST_PASS = 48  # exact candidates per round when the caller names none
ROOT_SHARE = 0.05  # a root writes at least this share of the strongest head's direct effect (32 prompts resolve tiny ones)
MAX_DEPTH = 4


def read_position(s: Any) -> str | None:
    """The named position the metric reads in every prompt (IOI's END), or None."""
    if s.named is None:
        return None
    read = s.task.positions
    for name in s.named.names:
        mask = s.named.mask(name)
        if bool((mask == read).all()) and bool(read.any()):
            return name
    return None


def key_positions(s: Any, pos: str) -> list[str]:
    """Named positions a query at ``pos`` can read in some prompt (at or before it)."""
    idx = s.named.index[pos]
    return [n for n in s.named.names if bool(((s.named.index[n] >= 0) & (s.named.index[n] <= idx)).any())]


def candidates(s: Any, node: Node, pos: str, senders: Sequence[Node] | None, inputs: Sequence[str]) -> list[Any]:
    """Every edge into ``node``'s inputs at ``pos``: q at ``pos``; k and v from each key position."""
    out = []
    for e in make_edges(s.model, [node], senders, inputs, strict=False):
        out += at_positions(e, [pos], [pos] if e.input == "q" else key_positions(s, pos))
    return out


def discover_positions(s: Any, inputs: Sequence[str] = ("q", "k", "v"), senders: Sequence[Node] | None = None,
                       first_pass: int | None = None) -> Any:
    """The discovered circuit's edge table (significant edges only); roles and faithfulness in ``attrs``."""
    import pandas as pd

    from headlens.circuits.faithfulness import measures
    from headlens.circuits.firstpass import FirstPass
    from headlens.circuits.roles import node_roles

    read = read_position(s)
    ranked = FirstPass(s, FIRST_PASS if first_pass is None else first_pass)
    logits = s.table([e for e in make_edges(s.model, [LOGITS], senders, ("resid",), strict=False)
                      for e in at_positions(e, [read], None)], what=f"discovery: patching the edges into the logits at {read}")
    logits.attrs["two_sided"] = True
    ranked.measured.append(logits)
    hit = logits[significant_mask(logits)]
    heads = hit[hit.sender.str.startswith("L")]
    strongest = float(heads.effect.abs().max()) if len(heads) else 0.0
    hit = hit[~hit.sender.str.startswith("L") | (hit.effect.abs() >= ROOT_SHARE * strongest)]
    tables = [hit]
    roots = [(_node(n), read) for n in hit.sender if n.startswith("L")]
    frontier, seen = list(roots), set(roots)
    for depth in range(MAX_DEPTH):
        if not frontier:
            break
        what = f"discovery round {depth + 1} (at most {MAX_DEPTH}): "
        edges = ranked.keep([e for node, pos in sorted(frontier) for e in candidates(s, node, pos, senders, inputs)],
                            what)
        df = s.table(edges, what=f"{what}patching {len(edges)} edges and their controls")
        df.attrs["two_sided"] = True
        ranked.compare(df)
        ranked.measured.append(df)
        keep = df[significant_mask(df)]
        tables.append(keep)
        frontier = []
        for row in keep.itertuples():
            node = (_node(row.sender), row.sender_pos) if row.sender.startswith("L") else None
            if node is not None and node not in seen:
                seen.add(node)
                frontier.append(node)
    s.done_patching()  # faithfulness records its own runs
    out = pd.concat(tables, ignore_index=True).sort_values("effect", key=abs, ascending=False, kind="stable")
    out = out.reset_index(drop=True)
    out.attrs.update(logits.attrs)
    out.attrs.update(two_sided=True, read_position=read, roots=[f"{n.name}@{p}" for n, p in roots],
                     first_pass=ranked.summary(), verdict="found" if len(out) else "inconclusive",
                     positions=s.named.names)
    if not len(out):
        out.attrs["why"] = (f"no sender's edge into the logits at {read} beats its control: nothing writes "
                            f"{s.metric} directly enough to start from")
        out.attrs.update(faithfulness=float("nan"), faithfulness_curve=[])
        return out
    out.attrs["roles"] = node_roles(out, read, s.labels, s)
    measured = pd.concat(ranked.measured, ignore_index=True)
    out.attrs.update(measures(s, out, measured, {(n.name, p) for n, p in roots}))
    return out


def _node(name: str) -> Node:
    layer, head = (int(x) for x in name[1:].split("H"))
    return Node("head", layer, head)
