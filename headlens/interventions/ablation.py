"""Head ablation: remove chosen heads' contributions through ``hook_z``, never the weights.

A head's whole contribution to the residual stream is its slice of ``hook_z``
``(B, T, H, d_head)`` multiplied by its rows of the output projection. Replacing that
slice removes the head and nothing else: the other heads of the layer, the output
projection's bias and every other sublayer are untouched. This works on every backend
that exposes ``blocks.{l}.attn.hook_z``.

Methods (what a removed head's ``z`` becomes):

* ``zero``: zeros. The head then adds nothing (the layer still adds ``c_proj``'s bias).
* ``mean``: the head's mean ``z`` over the reference prompts, **per position**: input
  position ``t`` gets the mean of ``z[:, t]`` over the reference prompts. Positions at or
  past the reference's length get the mean over all reference prompts and positions.
* ``resample``: the head's ``z`` on *another* reference prompt, position by position.
  Input row ``b`` takes reference row ``(b + s_b) % R`` with ``s_b`` drawn uniformly from
  ``1 .. R-1`` by a generator seeded with ``seed``; so when the reference is the input batch
  itself, no row ever gets its own activations back. Needs reference prompts at least as
  long as the input.
* ``uniform``: the head attends uniformly over its window: its ``z`` becomes the mean of its
  values over the keys its query sees (``k <= q`` in causal models, the non-pad keys in
  bidirectional ones). This is how Wu et al. 2024 "mask" retrieval heads (not by zeroing
  them): the head still adds a context average, but it can no longer pick a position. Its
  values come from the same forward pass (``hook_v``, observed before ``hook_z`` replaces the
  head), so no reference is needed; with grouped-query attention head ``h`` reads key/value
  head ``h // (n_heads / n_kv_heads)``.

Reference activations are computed once, on the clean model, when the context is entered.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from headlens.errors import HeadlensError, ProbeError, did_you_mean
from headlens.zoo.names import METHODS

Head = tuple[int, int]
HeadsSpec = str | Sequence[str | Sequence[int]]

_HEAD_RE = re.compile(r"^L(\d+)H(\d+)$", re.IGNORECASE)


class AblationError(HeadlensError, ValueError):
    """Bad ablation input: a malformed or out-of-range head id, an unknown method or metric."""

    exit_code = 2


def parse_heads(spec: HeadsSpec, n_layers: int, n_heads: int) -> list[Head]:
    """Parse heads given as ``"L1H2,L0H3"``, ``["L1H2"]`` or ``[(1, 2)]`` into ``(layer, head)`` pairs.

    Duplicates are dropped, order is kept.

    Args:
        spec: comma-separated ``L{layer}H{head}`` string, or a sequence of such strings or pairs.
        n_layers: the model's layer count (ids must be below it).
        n_heads: heads per layer (ids must be below it).

    Raises:
        AblationError: a malformed id, an id out of range, or no heads at all.

    >>> parse_heads("L1H2, l0h3", n_layers=2, n_heads=4)
    [(1, 2), (0, 3)]
    """
    items: list[Any] = [s for s in spec.split(",") if s.strip()] if isinstance(spec, str) else list(spec)
    heads: list[Head] = []
    for item in items:
        if isinstance(item, str):
            m = _HEAD_RE.match(item.strip())
            if m is None:
                raise AblationError(f"malformed head id {item.strip()!r}; expected L<layer>H<head>, e.g. 'L1H2'")
            layer, head = int(m.group(1)), int(m.group(2))
        elif isinstance(item, Sequence) and len(item) == 2 and all(_is_int(v) for v in item):
            layer, head = int(item[0]), int(item[1])
        else:
            raise AblationError(f"malformed head {item!r}; expected 'L1H2' or a (layer, head) pair of ints")
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise AblationError(
                f"head {format_head((layer, head))} is out of range; this model has layers 0..{n_layers - 1} "
                f"and heads 0..{n_heads - 1}"
            )
        if (layer, head) not in heads:
            heads.append((layer, head))
    if not heads:
        raise AblationError(f"no heads given in {spec!r}; expected e.g. 'L1H2,L0H3'")
    return heads


def _is_int(v: Any) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, torch.Tensor) and v.numel() == 1)


def format_head(head: Head) -> str:
    """``(1, 2) -> 'L1H2'`` (the TransformerLens display convention)."""
    return f"L{head[0]}H{head[1]}"


def format_heads(heads: Sequence[Head]) -> str:
    """``[(1, 2), (0, 3)] -> 'L1H2+L0H3'``: one table cell for a group of heads."""
    return "+".join(format_head(h) for h in heads)


def check_method(method: str) -> str:
    if method not in METHODS:
        raise AblationError(f"unknown ablation method {method!r}; expected one of {', '.join(METHODS)}"
                            f"{did_you_mean(method, METHODS)}")
    return method


def reference_tokens(model: Any, reference: Any) -> torch.Tensor:
    """Reference prompts as ``(R, T)`` token ids: a LongTensor as is, texts tokenized one by one
    (each with BOS) and cut to the shortest one's length."""
    if isinstance(reference, torch.Tensor):
        if reference.ndim != 2 or reference.shape[0] == 0:
            raise ProbeError(f"reference tokens must be (n_prompts, pos), got shape {tuple(reference.shape)}")
        return reference.to(model.device)
    texts = [reference] if isinstance(reference, str) else list(reference)
    if not texts:
        raise ProbeError("the reference set is empty; give at least one prompt")
    rows = [model.to_tokens(t)[0] for t in texts]
    n = min(len(r) for r in rows)
    return torch.stack([r[:n] for r in rows])  # (R, T)


@dataclass
class Replacement:
    """What a removed head's ``z`` becomes, for any input batch shape.

    ``ref_z[layer]`` holds the clean reference ``z`` ``(R, T_ref, H, d_head)`` of each layer
    that has a removed head (empty for ``zero`` and ``uniform``). ``uniform`` reads the current
    forward's values instead (``live``, filled by :func:`live_hooks`).
    """

    method: str
    ref_z: dict[int, torch.Tensor]
    seed: int = 0
    causal: bool = True  # uniform: a query sees keys k <= q (else every non-pad key)
    model: Any = field(default=None, repr=False, compare=False)  # uniform, bidirectional: whose padding to read

    def attention_mask(self) -> torch.Tensor | None:
        """``(B, K)`` padding mask of the forward in progress (bidirectional backends set it), else None."""
        if self.causal or self.model is None:
            return None
        return getattr(self.model, "current_attention_mask", None)

    @classmethod
    def build(cls, model: Any, layers: Sequence[int], method: str, reference: Any = None, seed: int = 0) -> Replacement:
        """Run the reference prompts once (clean) and keep ``hook_z`` of ``layers``."""
        check_method(method)
        if method in ("zero", "uniform"):
            return cls(method, {}, seed, bool(getattr(model, "is_causal", True)), model)
        if reference is None:
            raise AblationError(f"method={method!r} needs reference prompts (reference=...); 'zero' and 'uniform' do not")
        tokens = reference_tokens(model, reference)
        from headlens.interventions.logits import logits_at

        names = [f"blocks.{layer}.attn.hook_z" for layer in sorted(set(layers))]
        cache: dict[str, torch.Tensor] = {}

        def saver(name: str) -> Any:
            def save(z: torch.Tensor, hook: Any) -> None:
                cache[name] = z.detach()  # (R, T, H, d_head)

            return save

        one = torch.zeros(1, dtype=torch.long, device=tokens.device)  # only z is kept: unembed one position
        with torch.no_grad(), model.hooks([(n, saver(n)) for n in names]):
            logits_at(model, tokens, one)
        return cls(method, {int(n.split(".")[1]): cache[n] for n in names}, seed)

    def rows(self, batch: int, n_ref: int) -> torch.Tensor:
        """Reference row used by each input row under ``resample`` (never its own index if R > 1)."""
        gen = torch.Generator().manual_seed(self.seed)
        if n_ref == 1:
            return torch.zeros(batch, dtype=torch.long)
        shift = torch.randint(1, n_ref, (batch,), generator=gen)
        return (torch.arange(batch) + shift) % n_ref

    @property
    def needs_live(self) -> bool:
        """True when the replacement reads the current forward pass (``uniform``)."""
        return self.method == "uniform"

    def z(self, layer: int, like: torch.Tensor, live: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """Replacement ``z`` for every head of ``layer``, shaped like ``like`` ``(B, T, H, d_head)``.

        ``live`` holds this forward's ``"v"`` (and ``"visible"`` keys for bidirectional models) of
        ``layer``; only ``uniform`` reads it.
        """
        B, T = like.shape[:2]
        if self.method == "zero":
            return torch.zeros_like(like)
        if self.method == "uniform":
            if not live or "v" not in live:
                raise AblationError("uniform ablation needs the layer's values (hook_v) from the same forward")
            v = live["v"]  # (B, T, H_kv, d_head)
            visible = None
            if not self.causal:  # no padding mask: every key is real
                visible = live.get("visible", torch.ones(v.shape[:2], dtype=torch.bool, device=v.device))
            return uniform_z(v, like.shape[2], visible).to(like)
        ref = self.ref_z[layer].to(like.device, like.dtype)  # (R, T_ref, H, d_head)
        R, T_ref = ref.shape[:2]
        if self.method == "mean":
            per_pos = ref.mean(0)  # (T_ref, H, d_head): mean over reference prompts
            if T > T_ref:
                overall = ref.mean((0, 1)).expand(T - T_ref, -1, -1)  # (T - T_ref, H, d_head)
                per_pos = torch.cat([per_pos, overall])
            return per_pos[:T].expand(B, T, -1, -1)  # (B, T, H, d_head)
        if T > T_ref:
            raise ProbeError(
                f"resample ablation needs reference prompts at least as long as the input ({T} tokens); "
                f"the reference has {T_ref}"
            )
        return ref[self.rows(B, R).to(ref.device), :T]  # (B, T, H, d_head)


def uniform_z(v: torch.Tensor, n_heads: int, visible: torch.Tensor | None = None) -> torch.Tensor:
    """Every head's output under uniform attention: the mean of its values over the visible keys.

    Args:
        v: ``(B, T, H_kv, d_head)`` values (``H_kv`` divides ``n_heads``; fewer under GQA).
        n_heads: query heads; head ``h`` reads key/value head ``h // (n_heads // H_kv)``.
        visible: ``(B, K)`` bool non-pad keys for a bidirectional model; None for causal
            attention (query ``q`` sees keys ``0 .. q``; right padding never reaches a real row).

    Returns:
        ``(B, T, n_heads, d_head)``, in ``v``'s dtype.

    >>> v = torch.tensor([1.0, 2.0, 3.0]).view(1, 3, 1, 1)
    >>> uniform_z(v, 1).flatten().tolist()
    [1.0, 1.5, 2.0]
    >>> uniform_z(v, 2, visible=torch.tensor([[True, True, False]]))[0, :, 1, 0].tolist()
    [1.5, 1.5, 1.5]
    """
    _, T, H_kv, _ = v.shape
    if n_heads % H_kv:
        raise AblationError(f"{n_heads} query heads cannot share {H_kv} key/value heads evenly")
    x = v.double()
    if visible is None:
        n = torch.arange(1, T + 1, device=v.device, dtype=torch.float64)[None, :, None, None]
        mean = x.cumsum(1) / n  # (B, T, H_kv, d_head): row q averages keys 0..q
    else:
        w = visible.to(v.device, torch.float64)[:, :, None, None]  # (B, K, 1, 1)
        mean = ((x * w).sum(1, keepdim=True) / w.sum(1, keepdim=True).clamp_min(1)).expand_as(x)  # (B, T, H_kv, d)
    return mean.repeat_interleave(n_heads // H_kv, dim=2).to(v.dtype)  # (B, T, H, d_head): kv head -> its group


def live_hooks(layers: Sequence[int], store: dict[int, dict[str, torch.Tensor]],
               replacement: Replacement) -> list[tuple[str, Any]]:
    """Observers that keep this forward's ``hook_v`` of ``layers`` (and, for a bidirectional model,
    its non-pad keys) in ``store[layer]``, for ``uniform``."""
    def keep_v(layer: int) -> Any:
        def hook(v: torch.Tensor, hook: Any) -> None:  # (B, T, H_kv, d_head)
            entry = store.setdefault(layer, {})
            entry["v"] = v.detach()
            mask = replacement.attention_mask()
            if mask is not None:
                entry["visible"] = mask.bool()  # (B, K)

        return hook

    return [(f"blocks.{layer}.attn.hook_v", keep_v(layer)) for layer in layers]


def ablation_hooks(heads: Sequence[Head], replacement: Replacement) -> list[tuple[str, Any]]:
    """``(hook name, fn)`` pairs that replace ``heads``' slices of ``hook_z``, one hook per layer
    (plus, for ``uniform``, observers of the same layers' values)."""
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    live: dict[int, dict[str, torch.Tensor]] = {}

    def make(layer: int, idx: list[int]) -> Any:
        def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:  # z: (B, T, H, d_head)
            out = z.clone()
            out[:, :, idx] = replacement.z(layer, z, live.pop(layer, None))[:, :, idx]
            return out

        return hook

    observe = live_hooks(sorted(by_layer), live, replacement) if replacement.needs_live else []
    return observe + [(f"blocks.{layer}.attn.hook_z", make(layer, idx)) for layer, idx in sorted(by_layer.items())]


@contextlib.contextmanager
def ablate(
    model: Any,
    heads: HeadsSpec,
    method: str = "zero",
    reference: Any = None,
    seed: int = 0,
) -> Iterator[Any]:
    """Context manager: inside it, ``heads`` are removed from every forward pass of ``model``.

    Args:
        model: any headlens backend (native GPT or TransformerBridge).
        heads: ``"L1H2,L0H3"``, ``["L1H2"]`` or ``[(1, 2)]``.
        method: ``"zero"``, ``"mean"`` (per-position mean over ``reference``), ``"resample"``
            (another reference prompt's activations, chosen with ``seed``) or ``"uniform"`` (the head
            attends uniformly over its window); see the module docstring.
        reference: prompts (texts or ``(R, T)`` token ids) for ``mean`` and ``resample``.
        seed: seeds the choice of reference rows for ``resample``.

    Yields:
        The model, with the ablation hooks installed; they are removed on exit, also on error.

    >>> import headlens, torch
    >>> model = headlens.GPT(headlens.ModelConfig(n_layers=1, n_heads=2, d_model=8, n_ctx=16, d_vocab=257))
    >>> with headlens.ablate(model, "L0H1"):
    ...     logits = model("hello")
    >>> model.active_hooks()
    []
    """
    check_method(method)
    parsed = parse_heads(heads, model.n_layers, model.n_heads)
    replacement = Replacement.build(model, [layer for layer, _ in parsed], method, reference, seed)
    with model.hooks(ablation_hooks(parsed, replacement)):
        yield model
