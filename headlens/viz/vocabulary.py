"""The report's vocabulary section: what each labelled vocabulary head writes, read off its weights.

For the heads labelled ``ov_copying``, ``ov_suppression`` or ``successor`` (docs/scores.md): score, interval
and null, and what the head writes for a few example tokens (its top 5 for ov_copying and successor heads,
its bottom 5 for suppression heads; :func:`headlens.readout.ov.head_logits`); then the null over all
heads, and each ordered list's succession score for the strongest successor candidates, so a reader sees
what a head does to "Monday" and whether any head is a successor head at all.
"""

from __future__ import annotations

import html
from typing import Any

import torch

from headlens.viz.patterns import display_token

VOCAB_TYPES = ("ov_copying", "ov_suppression", "successor")
N_EXAMPLES = 3  # example tokens per labelled head
N_CANDIDATES = 5  # successor heads shown with their per-list scores, labelled or not


def _text(model: Any, ids: torch.Tensor) -> list[str]:
    tok = getattr(model, "tokenizer", None)
    if hasattr(tok, "convert_ids_to_tokens") and hasattr(tok, "decode"):  # Hugging Face: ' Paris', not 'ĠParis'
        return [tok.decode([int(i)]) for i in ids]
    return model.to_str_tokens(ids)


def _examples(model: Any) -> torch.Tensor:
    """A few tokens to show what heads write for: first items of the ordered lists, else ordinary words."""
    from headlens.models.vocab import vocab
    from headlens.probes.ordinal import ordinal_lists

    seen, ids = set(), []
    for o in ordinal_lists(model):
        base = o.name.split("_")[0]
        if base not in seen:
            seen.add(base)
            ids.append(int(o.ids[len(o.ids) // 3]))
    v = vocab(model)
    ids += list(v.filler or v.ordinary)[: N_EXAMPLES]
    return torch.tensor(ids[:N_EXAMPLES], dtype=torch.long)


def _writes(model: Any, layer: int, head: int, ids: torch.Tensor, largest: bool) -> str:
    from headlens.readout.ov import head_logits

    logits = head_logits(model, layer, head, ids)  # (n, V)
    out = []
    for src, row in zip(_text(model, ids), logits.topk(5, dim=-1, largest=largest).indices, strict=True):
        out.append(f"{display_token(src)} → " + " ".join(display_token(t) for t in _text(model, row)))
    return "<br>".join(out)


def vocabulary_section(model: Any, table: Any) -> list[str]:
    """HTML parts of the section, or nothing when the table scored no vocabulary detector."""
    scored = [d for d in VOCAB_TYPES if d in set(table["detector"])]
    if not scored:
        return []
    weights = table.attrs.get("weights", {})
    nulls = [f"{d}: chance {weights[d]['chance']:.2g}, null {weights[d]['null_score']['pooled']:.2g} over all heads"
             for d in scored if "null_score" in weights.get(d, {})]
    parts = ["<h2>Vocabulary heads</h2>",
             "<p>From the weights: a token's effective embedding through the head's OV, the folded norms and the "
             f"unembedding (docs: Vocabulary heads). {html.escape('; '.join(nulls))}.</p>"]
    rows = table[table["detector"].isin(scored) & table["label"]].sort_values("score", ascending=False)
    if rows.empty:
        parts.append("<p>No head carries a vocabulary label.</p>")
    else:
        ids = _examples(model)
        head = "".join(f"<th>{c}</th>" for c in ("head", "label", "score", "95% CI", "null", "writes (top or bottom 5)"))
        body = "".join(
            f"<tr><td>L{r.layer}H{r.head}</td><td>{r.detector}</td><td>{r.score:.3f}</td>"
            f"<td>[{r.ci_low:.3f}, {r.ci_high:.3f}]</td><td>{getattr(r, 'null', float('nan')):.3f}</td>"
            f"<td style='text-align:left'>{_writes(model, r.layer, r.head, ids, r.detector != 'ov_suppression')}"
            f"</td></tr>" for r in rows.itertuples())
        parts.append(f"<table><tr>{head}</tr>{body}</table>")
    if "successor" in scored and "per_list" in weights.get("successor", {}):
        parts += _successor_lists(table, weights["successor"]["per_list"])
    return parts


def _successor_lists(table: Any, per_list: dict[str, list[list[float]]]) -> list[str]:
    best = table[table["detector"] == "successor"].sort_values("score", ascending=False).head(N_CANDIDATES)
    names = list(per_list)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["head", "score", "predecessor", *names])
    body = "".join(
        f"<tr><td>L{r.layer}H{r.head}</td><td>{r.score:.2f}</td><td>{getattr(r, 'null', float('nan')):.2f}</td>"
        + "".join(f"<td>{per_list[n][r.layer][r.head]:.2f}</td>" for n in names) + "</tr>"
        for r in best.itertuples())
    return [f"<h3>Succession per list (the {N_CANDIDATES} strongest heads)</h3>",
            f"<table><tr>{head}</tr>{body}</table>"]
