"""Roles of a positional circuit's nodes: what each head does where, in the IOI paper's vocabulary.

A node is a head at a named position (``L23H0@END``). Its role comes from where it sits in the circuit,
what it attends to there (the clean pattern, averaged over prompts) and ``classify``'s labels:

* a head whose edge into the logits at the read position is significant, and which attends from there to
  a name (IO, S1 or S2: at least :data:`NAME_MASS` of its attention): **name mover** when it writes for the
  name it attends to, **negative name mover** when it writes against it (copy suppression: McDougall et al.
  2023). Attending to IO and writing the answer (its ablation lowers ``logit_diff``) is a name mover;
  attending to S and writing the answer (pushing S down) a negative one. A writer attending to no name is
  ``writes the answer`` or ``writes against``;
* a head at the read position with a significant edge into a name mover's **query**: **S-inhibition**;
* a head at S2 attending to S1+1 more than to S1: **induction**; to S1 more: **duplicate token** (Wang et
  al. 2022, §3: the two look back at the first S from its second mention, one through the token after it);
* a head at S1+1 attending to S1 more than to any other position: **previous token**;
* anything else: its position (``at IO``), and the labels of ``classify`` when given.

The labels join the role (``induction (induction, previous_token)``) when a scores table was passed.
Without IOI's positions the roles say only where a head writes (``writes the answer`` / ``writes against``).
"""

from __future__ import annotations

from typing import Any

import torch

IOI_POSITIONS = {"IO", "S1", "S1+1", "S2", "END"}
NAME_MASS = 0.2  # attention on the names (IO + S1 + S2) from END for a writer to count as reading one


def attention(s: Any, nodes: list[tuple[str, str]]) -> dict[tuple[str, str], dict[str, float]]:
    """Per node, its mean clean attention from its position to each named position (over prompts having both)."""
    layers = sorted({int(n[1:].split("H")[0]) for n, _ in nodes})
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in layers]
    cache = getattr(s, "patterns", None)  # recorded with discovery's clean run
    if cache is None or not all(n in cache for n in names):
        kwargs = {} if s.task.attention_mask is None else {"attention_mask": s.task.attention_mask}
        with torch.no_grad():
            _, cache = s.model.run_with_cache(s.task.tokens, names_filter=names, **kwargs)
    out: dict[tuple[str, str], dict[str, float]] = {}
    idx = s.named.index
    for name, pos in nodes:
        layer, head = (int(x) for x in name[1:].split("H"))
        p = cache[f"blocks.{layer}.attn.hook_pattern"][:, head]  # (B, Q, K)
        q = idx[pos]
        row: dict[str, float] = {}
        for key, k in idx.items():
            ok = (q >= 0) & (k >= 0) & (k <= q)
            if bool(ok.any()):
                b = ok.nonzero().flatten()
                row[key] = float(p[b, q[b], k[b]].mean())
        out[name, pos] = row
    return out


def node_roles(df: Any, read: str, labels: dict[str, str] | None, s: Any = None) -> dict[str, str]:
    """``{"L23H0@END": "name mover", ...}`` for every head node of the edge table ``df``."""
    from headlens.circuits.edges import higher_is_worse

    ioi = s is not None and IOI_POSITIONS <= set(s.named.names)
    worse = higher_is_worse(df.attrs.get("metric", "logit_diff"))
    roles: dict[tuple[str, str], str] = {}
    writers = [r for r in df[df.receiver == "logits"].itertuples() if r.sender.startswith("L")]
    nodes = {(r.sender, r.sender_pos) for r in df.itertuples() if r.sender.startswith("L")}
    every = sorted({(r.sender, read) for r in writers} | nodes)
    seen = attention(s, every) if (ioi and every) else {}  # one forward for the writers and the rest
    for r in writers:
        writes = (r.effect < 0) != worse  # ablating it hurts: it writes the answer
        roles[r.sender, read] = _writer(writes, seen.get((r.sender, read), {}))
    movers = {k for k, v in roles.items() if v in ("name mover", "negative name mover", "writes the answer")}
    for r in df.itertuples():
        node = (r.sender, r.sender_pos)
        if r.sender.startswith("L") and node not in roles and r.input == "q" and (r.receiver, r.receiver_pos) in movers:
            roles[node] = "S-inhibition" if ioi else "into a writer's query"
    rest = sorted(nodes - set(roles))
    for node in rest:
        roles[node] = _by_attention(node[1], seen.get(node, {}))
    out = {}
    for (name, pos), role in roles.items():
        extra = (labels or {}).get(name, "")
        out[f"{name}@{pos}"] = f"{role} ({extra})" if extra else role
    return out


def _writer(writes: bool, att: dict[str, float]) -> str:
    """A direct writer's role from whether it writes the answer and which name it attends to."""
    io, s = att.get("IO", 0.0), att.get("S1", 0.0) + att.get("S2", 0.0)
    if io + s < NAME_MASS:
        return "writes the answer" if writes else "writes against"
    copies = writes == (io >= s)  # it writes for the name it attends to
    return "name mover" if copies else "negative name mover"


def _by_attention(pos: str, att: dict[str, float]) -> str:
    if pos == "S2" and {"S1", "S1+1"} <= set(att):
        return "induction" if att["S1+1"] > att["S1"] else "duplicate token"
    if pos == "S1+1" and att and max(att, key=att.get) == "S1":
        return "previous token"
    return f"at {pos}"
