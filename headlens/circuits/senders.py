"""Each sender's ablation delta: what its direct write to the residual stream changes by when it is ablated.

One clean run caches every sender's activation: each head's ``hook_z``, each MLP's output and the
embedding (``blocks.0.hook_resid_pre``: token plus position embedding, scaled as the model scales it), plus
what the write path needs (a post-attention norm's input). A sender's delta ``(B, T, d_model)`` is the change
of its write to the residual stream when its activation is replaced, as the family's own modules compute it
(:mod:`headlens.readout.write`: ``dz_h @ W_O[h]`` without a post-sublayer norm, through the norm where
there is one).

Methods (what the sender's activation becomes), as in :mod:`headlens.interventions.ablation`:

* ``zero``, ``mean`` (per position over the reference prompts), ``resample`` (another reference prompt,
  chosen with ``seed``; never a prompt's own row when the reference is the input);
* ``corrupted``: the same row of a corrupted run (reference row ``b`` for input row ``b``), as
  TransformerLens' ``get_act_patch_direct_path`` does. The reference needs at least as many prompts
  and positions as the input.

**Aligned prompts** (:class:`Alignment`: the IOI probe, whose reference is each prompt's corrupted ABC twin).
Prompts of different templates put different words at one position, so a per-position mean over all of
them mixes the wrong tokens (and padding). Aligned, ``mean`` at a named position (IO, S1, S1+1, S2, END) is
the mean over every reference prompt *at its own* such position, and elsewhere the mean over the
reference prompts of the same layout (template and order); ``resample`` draws another prompt the same way.
This is the IOI paper's mean ablation over the corrupted (ABC) distribution, position by position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from headlens.circuits.nodes import CircuitError, Node
from headlens.errors import ProbeError, did_you_mean
from headlens.interventions.ablation import Replacement, reference_tokens
from headlens.readout.write import write_path
from headlens.zoo.names import EDGE_METHODS as METHODS


def check_method(method: str) -> str:
    if method not in METHODS:
        raise CircuitError(f"unknown edge ablation method {method!r}; expected one of {', '.join(METHODS)}"
                           f"{did_you_mean(method, METHODS)}")
    return method


def _run(model: Any, names: dict[str, str], tokens: torch.Tensor,
         attention_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    kwargs = {} if attention_mask is None else {"attention_mask": attention_mask}
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=list(names.values()), **kwargs)
    return {key: cache[name].detach() for key, name in names.items()}


@dataclass(frozen=True)
class Alignment:
    """Which positions of different prompts mean the same thing (see the module docstring).

    Attributes:
        named: name -> ``(B,)`` token index per prompt (``-1``: none), the same in each reference row.
        group: ``(B,)`` layout id: prompts with the same length and named positions share one.
    """

    named: dict[str, torch.Tensor]
    group: torch.Tensor

    @classmethod
    def of(cls, task: Any, named: dict[str, torch.Tensor]) -> Alignment:
        """The alignment of a task's prompts (their real lengths and named positions)."""
        B, T = task.tokens.shape
        length = (task.attention_mask.sum(1) if task.attention_mask is not None
                  else torch.full((B,), T)).cpu()
        keys = [(int(length[b]), *(int(v[b]) for v in named.values())) for b in range(B)]
        ids = {k: i for i, k in enumerate(dict.fromkeys(keys))}
        return cls({k: v.cpu() for k, v in named.items()}, torch.tensor([ids[k] for k in keys]))


def aligned_replaced(clean: torch.Tensor, ref: torch.Tensor, method: str, seed: int, al: Alignment) -> torch.Tensor:
    """``clean`` ``(B, T, ...)`` replaced from row-aligned reference activations ``ref`` ``(B, T, ...)``."""
    B = clean.shape[0]
    ref = ref[:B, : clean.shape[1]].to(clean)
    gen = torch.Generator().manual_seed(seed)
    out = torch.empty_like(clean)
    for g in al.group.unique().tolist():
        rows = (al.group == g).nonzero().flatten()  # prompts of one layout
        if method == "mean":
            out[rows] = ref[rows].mean(0)
        else:  # resample: another prompt of the layout (its own ABC twin when it is alone)
            pick = rows[torch.randint(len(rows), (len(rows),), generator=gen)]
            alone = pick == rows
            pick[alone] = rows[(torch.arange(len(rows))[alone] + 1) % len(rows)]
            out[rows] = ref[pick]
    perm = _derangement(B, gen)
    for idx in al.named.values():
        has = (idx >= 0).nonzero().flatten()
        if not len(has):
            continue
        at = ref[has, idx[has]]  # (n, ...): every prompt's activation at its own named position
        if method == "mean":
            out[has, idx[has]] = at.mean(0)
        else:
            src = perm[has]
            ok = idx[src] >= 0
            out[has[ok], idx[has[ok]]] = ref[src[ok], idx[src[ok]]]
    return out


def _derangement(n: int, gen: torch.Generator) -> torch.Tensor:
    """A random permutation of ``range(n)`` with no fixed point (identity for n < 2)."""
    if n < 2:
        return torch.arange(n)
    perm = torch.randperm(n, generator=gen)
    fixed = perm == torch.arange(n)
    while bool(fixed.any()):
        perm = torch.randperm(n, generator=gen)
        fixed = perm == torch.arange(n)
    return perm


def replaced(clean: torch.Tensor, ref: torch.Tensor | None, method: str, seed: int,
             aligned: Alignment | None = None) -> torch.Tensor:
    """``clean`` ``(B, T, ...)`` replaced under ``method`` from reference activations ``(R, T_ref, ...)``
    (``aligned``: row-aligned reference prompts whose positions mean different things, see :class:`Alignment`)."""
    if method == "zero":
        return torch.zeros_like(clean)
    B, T = clean.shape[:2]
    if aligned is not None and method in ("mean", "resample"):
        return aligned_replaced(clean, ref, method, seed, aligned)
    if method == "corrupted":
        if ref.shape[0] < B or ref.shape[1] < T:
            raise ProbeError(f"corrupted patching needs a reference of at least {B} prompts x {T} tokens, "
                             f"got {ref.shape[0]} x {ref.shape[1]}")
        return ref[:B, :T].to(clean)
    flat = clean.reshape(B, T, 1, -1)  # (B, T, 1, n): Replacement works on (B, T, H, d)
    rep = Replacement(method, {0: ref.reshape(*ref.shape[:2], 1, -1)}, seed)
    return rep.z(0, flat).reshape(clean.shape).to(clean)


class SenderDeltas:
    """Every sender's delta ``(B, T, d_model)`` on ``tokens``, from one clean and one reference run.

    ``recorded``: the clean activations by hook name, already cached from a forward on ``tokens`` (discovery's
    recorded clean run), instead of a forward of its own.

    Attributes:
        clean: cached clean activations by key (``z{l}``, ``mlp{l}``, ``embed``).
    """

    def __init__(self, model: Any, tokens: torch.Tensor, method: str = "mean", reference: Any = None,
                 seed: int = 0, attention_mask: torch.Tensor | None = None, aligned: Alignment | None = None,
                 recorded: dict[str, torch.Tensor] | None = None) -> None:
        check_method(method)
        self.model, self.method, self.seed, self.aligned = model, method, seed, aligned
        self.write = write_path(model)
        names = self.write.activations()
        self.clean = ({key: recorded[name] for key, name in names.items()} if recorded is not None
                      else _run(model, names, tokens, attention_mask))
        self.ref: dict[str, torch.Tensor] = {}
        if method != "zero":
            ref = tokens if reference is None else reference_tokens(model, reference)
            self.ref = self.clean if ref is tokens else _run(model, names, ref)
        self._w_o: dict[int, torch.Tensor] = {}
        self._repl: dict[str, torch.Tensor] = {}

    def _replaced(self, key: str) -> torch.Tensor:
        if key not in self._repl:
            self._repl[key] = replaced(self.clean[key], self.ref.get(key), self.method, self.seed, self.aligned)
        return self._repl[key]

    def replacement(self, node: Node) -> torch.Tensor:
        """What ``node``'s activation becomes under the method, for the whole layer: ``z{l}`` ``(B, T, H, d_head)``,
        an MLP's output before any post-norm or the embedding ``(B, T, D)`` (no write computed)."""
        return self._replaced({"head": f"z{node.layer}", "mlp": f"mlp{node.layer}"}.get(node.kind, "embed"))

    def delta(self, node: Node) -> torch.Tensor:
        """``(B, T, d_model)``: how much ``node``'s write to the residual stream changes when it is ablated."""
        if node.kind == "embed":
            return self._replaced("embed") - self.clean["embed"]
        if node.kind == "mlp":
            key = f"mlp{node.layer}"
            return self.write.mlp(node.layer, self._replaced(key), self.clean[key])
        if node.kind != "head":
            raise CircuitError(f"{node} cannot be a sender; expected a head, embed or mlp<layer>")
        layer, key = node.layer, f"z{node.layer}"
        dz = self._replaced(key)[:, :, node.head] - self.clean[key][:, :, node.head]  # (B, T, d_head)
        if layer not in self._w_o:
            self._w_o[layer] = self.write.w_o(layer)
        return self.write.head(layer, node.head, dz, self.clean.get(f"attn{layer}"), self._w_o[layer])  # (B, T, D)
