"""Compiled ground truth: RASP programs compiled by tracr, and the edges of their RASP graphs.

A tracr model's every head and MLP implements one node of a RASP program, so its circuit is known
before any experiment: a ``Select(keys, queries)`` aggregated over ``sop`` is a head whose query reads
``queries``, whose key reads ``keys`` and whose value reads ``sop``; each of those SOps is written by
the embedding (``tokens``, ``indices``), an MLP (``Map``, ``SequenceMap``, the counting half of
``SelectorWidth``) or another head (``Aggregate``). :func:`rasp_edges` reads those edges off the RASP
graph (the program's own data dependencies), not off any measurement: ACDC's published tracr
"truth" came from an ACDC run and is not used.

:func:`compile_program` compiles, converts (:func:`headlens.models.tracr.from_tracr`) and checks that
the headlens model gives tracr's outputs; :func:`edge_scores` measures every candidate edge of the
model by exact edge patching, and :func:`roc_auc` scores how well the effects rank the true edges.

Needs the optional extra: ``pip install 'headlens[tracr]'`` (tracr-pypi, which pulls jax).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from headlens.circuits.nodes import EMBED, LOGITS, Edge, Node
from headlens.errors import HeadlensError

BOS, PAD = "compiler_bos", "compiler_pad"


def _need_tracr() -> None:
    try:
        import tracr  # noqa: F401
    except ImportError:
        raise HeadlensError("tracr is not installed; pip install 'headlens[tracr]' (it pulls jax)") from None


@dataclass
class Compiled:
    """A compiled program: the headlens model, the RASP graph's edges, and the edges worth testing.

    ``truth``: ``(sender, receiver, input)`` names (``input`` is ``q|k|v``, ``resid`` for ``logits``).
    ``candidates``: every edge between the model's working parts (heads and MLPs the program uses,
    the embedding, the logits) that the forward order allows; the truth is a subset.
    """

    name: str
    model: Any
    truth: set[tuple[str, str, str]]
    candidates: list[Edge]
    prompt: Callable[[random.Random], str]
    heads: list[str] = field(default_factory=list)

    def prompts(self, n: int, seed: int = 0) -> list[str]:
        rng = random.Random(seed)
        return [self.prompt(rng) for _ in range(n)]

    def is_true(self, e: Edge) -> bool:
        return (e.sender.name, e.receiver.name, e.input) in self.truth


def _parts(block: Any) -> list[Any]:
    """The attention heads and MLPs inside a craft block."""
    from tracr.craft import transformers as t

    if isinstance(block, t.AttentionHead | t.MLP):
        return [block]
    if isinstance(block, t.MultiAttentionHead):
        return list(block.heads())
    if isinstance(block, t.SeriesWithResiduals):
        return [p for b in block.blocks for p in _parts(b)]
    return []


def _selector_reads(sel: Any) -> tuple[set[str], set[str]]:
    """``(query labels, key labels)`` of a selector, through ``SelectorAnd/Or/Not``."""
    from tracr.rasp import rasp

    if isinstance(sel, rasp.Select):
        return {sel.queries.label}, {sel.keys.label}
    qs: set[str] = set()
    ks: set[str] = set()
    for child in sel.children:
        q, k = _selector_reads(child)
        qs, ks = qs | q, ks | k
    return qs, ks


def rasp_edges(graph: Any, craft: Any, sink_label: str) -> tuple[set[tuple[str, str, str]], list[Node], list[Node]]:
    """The RASP graph's edges into heads' q/k/v and the logits, as ``(sender, receiver, input)`` names,
    with the heads and MLPs the program uses (its working parts, in forward order)."""
    from tracr.compiler import assemble, nodes
    from tracr.craft import transformers as t
    from tracr.rasp import rasp

    _, module_names = assemble._get_model_config_and_module_names(craft)
    owner = {id(p): label for label, d in graph.nodes(data=True) for p in _parts(d.get(nodes.MODEL_BLOCK))}
    heads: list[tuple[Node, Any]] = []
    writes: dict[str, set[str]] = {"tokens": {"embed"}, "indices": {"embed"}}
    mlps: list[Node] = []
    for module_name, block in zip(module_names, craft.blocks, strict=True):
        layer = int(module_name.split("layer_")[1].split("/")[0])
        if isinstance(block, t.MLP):
            node = Node("mlp", layer)
            mlps.append(node)
            for d in block.snd.output_space.basis:
                writes.setdefault(d.name, set()).add(node.name)
            continue
        for h, head in enumerate(block.as_multi().heads()):
            node = Node("head", layer, h)
            heads.append((node, head))
            for d in head.w_ov.output_space.basis:
                writes.setdefault(d.name, set()).add(node.name)
    truth: set[tuple[str, str, str]] = set()
    for node, head in heads:
        expr = graph.nodes[owner[id(head)]][nodes.EXPR]
        if isinstance(expr, rasp.Aggregate | rasp.SelectorWidth):
            q, k = _selector_reads(expr.selector)
            v = {expr.sop.label} if isinstance(expr, rasp.Aggregate) else set()
            for c, labels in (("q", q), ("k", k), ("v", v)):
                truth |= {(w, node.name, c) for label in labels for w in writes.get(label, ())
                          if w == "embed" or _layer(w) < node.layer}
    truth |= {(w, LOGITS.name, "resid") for w in writes[sink_label]}
    return truth, [n for n, _ in heads], mlps


def _layer(name: str) -> int:
    return int(name[3:]) if name.startswith("mlp") else int(name[1:].split("H")[0])


def compile_program(name: str, program: Any, vocab: set[Any], max_seq_len: int, prompt: Callable[[random.Random], str],
                    causal: bool = False, check: int = 16) -> Compiled:
    """Compile ``program`` with tracr, convert it to a headlens GPT and read its true edges.

    ``prompt(rng)`` draws one input string (one character per token; no BOS). ``check`` prompts are run
    through both models: the headlens model's argmax must be tracr's output at every position.
    """
    _need_tracr()
    from tracr.compiler import (
        basis_inference,
        craft_graph_to_model,
        craft_model_to_transformer,
        expr_to_craft_graph,
        rasp_to_graph,
    )
    from tracr.craft import bases
    from tracr.rasp import rasp

    from headlens.models.tracr import from_tracr

    extracted = rasp_to_graph.extract_rasp_graph(program)
    graph, sources, sink = extracted.graph, extracted.sources, extracted.sink
    basis_inference.infer_bases(graph, sink, vocab, max_seq_len)
    expr_to_craft_graph.add_craft_components_to_rasp_graph(graph, bos_dir=bases.BasisDirection(rasp.tokens.label, BOS))
    craft = craft_graph_to_model.craft_graph_to_model(graph, sources)
    assembled = craft_model_to_transformer.craft_model_to_transformer(
        craft_model=craft, graph=graph, sink=sink, max_seq_len=max_seq_len, compiler_bos=BOS, compiler_pad=PAD,
        causal=causal)
    model = from_tracr(assembled, program.label, name=f"tracr-{name}")
    check_conversion(model, assembled, [prompt(random.Random(i)) for i in range(check)])
    truth, heads, mlps = rasp_edges(graph, craft, program.label)
    parts = [EMBED, *sorted(heads + mlps, key=lambda n: (n.layer, n.kind != "head", n.head))]
    candidates = [Edge(s, r, c) for r in [*heads, LOGITS] for s in parts if r.reads_after(s)
                  for c in (("resid",) if r.kind == "logits" else ("q", "k", "v"))]
    return Compiled(name, model, truth, candidates, prompt, [h.name for h in heads])


def check_conversion(model: Any, assembled: Any, prompts: Sequence[str]) -> None:
    """The headlens model's argmax equals tracr's decoded output at every non-BOS position."""
    tok = model.tokenizer
    by_char = {str(v): v for v in assembled.input_encoder.encoding_map}
    for text in prompts:
        want = assembled.apply([BOS, *(by_char[c] for c in text)]).decoded[1:]
        with torch.no_grad():
            got = model(model.to_tokens(text))[0, 1:].argmax(-1).tolist()
        mine = [tok.alphabet[i] if i < len(tok.alphabet) else "?" for i in got]
        if [str(w) for w in want] != mine:
            raise HeadlensError(f"{model.name}: the converted model disagrees with tracr on {text!r}: "
                                f"tracr {want}, headlens {mine}")


def roc_auc(scores: Sequence[float], positive: Sequence[bool]) -> float:
    """Area under the ROC curve: the chance a random true edge outscores a random false one (ties count
    half). NaN when either class is empty.

    >>> roc_auc([0.9, 0.8, 0.1, 0.0], [True, True, False, False])
    1.0
    >>> roc_auc([0.5, 0.5], [True, False])
    0.5
    """
    s, y = np.asarray(scores, dtype=float), np.asarray(positive, dtype=bool)
    pos, neg = s[y], s[~y]
    if not len(pos) or not len(neg):
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


def edge_scores(c: Compiled, method: str = "mean", n_prompts: int = 32, seed: int = 0, n_boot: int = 200) -> Any:
    """Every candidate edge measured exactly (``kl`` on the program's output), with two more columns:
    ``true`` (a RASP graph edge) and ``tested`` (the patch changed the receiver's input at all)."""
    from headlens.circuits.api import setup

    s = setup(c.model, "kl", method, c.prompts(n_prompts, seed), n_prompts=n_prompts, n_control=0, n_boot=n_boot,
              seed=seed)
    df = s.table(c.candidates, composition=False)
    df["true"] = [c.is_true(e) for e in c.candidates]
    names = [f"blocks.{layer}.hook_resid_pre" for layer in range(c.model.cfg.n_layers)]
    names.append(f"blocks.{c.model.cfg.n_layers - 1}.hook_resid_post")
    with torch.no_grad():  # one clean run: every receiver's input
        _, cache = c.model.run_with_cache(s.task.tokens, names_filter=names, attention_mask=s.task.attention_mask)
    df["tested"] = [input_change(c.model, cache, s.task, s.deltas.delta(e.sender), e) > 1e-6 for e in c.candidates]
    return df


def input_change(model: Any, cache: Any, task: Any, delta: Any, e: Edge) -> float:
    """How much patching edge ``e`` (its sender's ``delta`` ``(B, T, D)``) moves what its receiver reads,
    relative to the clean input (max norm, real positions); ``cache`` holds the clean run's residual streams.

    Zero means the ablation cannot test the edge: per-position mean and resample ablations leave
    everything a sender writes about *positions* as it was (every prompt has the same positions), so an
    edge that carries only position information reads exactly its clean input and shows no effect.
    """
    from headlens.circuits.native import input_rows

    r = e.receiver
    with torch.no_grad():
        if r.kind == "logits":
            x = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]  # (B, T, D)
            read = lambda x: model.lm_head(model.transformer.ln_f(x))  # noqa: E731
        else:
            block, rows = model.transformer.h[r.layer], input_rows(model.cfg, e.input, r.head)
            x = cache[f"blocks.{r.layer}.hook_resid_pre"]  # (B, T, D)
            w, b = block.attn.c_attn.weight[rows], block.attn.c_attn.bias[rows]  # (d_head, D), (d_head,)
            read = lambda x: torch.nn.functional.linear(block.ln_1(x), w, b)  # noqa: E731
        clean = read(x)  # (B, T, width)
        real = torch.ones_like(task.tokens, dtype=torch.bool) if task.attention_mask is None else task.attention_mask.bool()
        moved = (read(x + delta) - clean)[real].abs().max()  # padding is read by no one
    return float(moved / clean.abs().max().clamp_min(1e-12))


# -- the programs ----------------------------------------------------------------------------------
def _letters(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _repeat(rng: random.Random, alphabet: str, seg: int) -> str:
    r = "".join(rng.sample(alphabet, seg))
    return r + r


def programs() -> dict[str, Callable[[], Compiled]]:
    """The compiled ground truths, by name (each compiles in a few seconds)."""
    _need_tracr()
    from tracr.compiler import lib
    from tracr.rasp import rasp

    def reverse() -> Compiled:
        return compile_program("reverse", lib.make_reverse(rasp.tokens).named("reverse"), set("abcd"), 6,
                               lambda rng: _letters(rng, "abcd", rng.randint(2, 6)))

    def sort() -> Compiled:
        prog = lib.make_sort(rasp.tokens, rasp.tokens, max_seq_len=6, min_key=1).named("sort")
        return compile_program("sort", prog, {1, 2, 3, 4, 5}, 6, lambda rng: _letters(rng, "12345", rng.randint(2, 6)))

    def induction() -> Compiled:
        """Copy what followed the last occurrence of the current token: a previous-token head (its query
        reads ``indices - 1`` from an MLP) whose output the induction head's *key* reads."""
        shifted = rasp.Map(lambda i: i - 1, rasp.indices).named("shifted")
        prev = rasp.Aggregate(rasp.Select(rasp.indices, shifted, rasp.Comparison.EQ), rasp.tokens).named("prev")
        nxt = rasp.Aggregate(rasp.Select(prev, rasp.tokens, rasp.Comparison.EQ), rasp.tokens).named("induction")
        return compile_program("induction", nxt, set("abcdefgh"), 10,
                               lambda rng: _repeat(rng, "abcdefgh", rng.randint(3, 5)), causal=True)

    return {"reverse": reverse, "sort": sort, "induction": induction}
