"""The scan engine: run a probe through a model once and score every detector from one pass.

Why it looks like this:

* **Sparse targets** (``headlens.detectors.base``): every detector gives ``(B, Q, M)`` key
  indices, ``-1`` padded. The targets of a batch are built once, before the forward pass, packed
  row by row (:class:`headlens.scoring.lse.PackedTargets`, O(number of targets)), and shared by all
  layers. ``windowed`` detectors are asked for a few rows at a time, so even duplicate-token
  targets on 32k tokens of byte-level text (thousands per row) never sit in one padded tensor.
* **Or a rule** (targets too many to list): a detector with a ``predicate`` over (query, key) whose list would pass
  ``headlens.scoring.scan.INDEX_MAX`` targets is scored from its rule instead, evaluated on each
  query block of scores and dropped with it (:class:`headlens.scoring.lse.PredicateTargets`): memory
  O(block + T) whatever the number of targets, for the price of one more pass over each block.
* **Two ways to read the attention**, same numbers (tests compare them to 1e-6):

  - ``"dense"``: one hook per layer on ``blocks.{l}.attn.hook_pattern``; the ``(B, H, Q, K)``
    pattern is gathered at the targets and dropped. Needs O(T²) memory per layer: the reference,
    and the cheaper path for short prompts.
  - ``"sparse"``: hooks on the layer's q and k (after RoPE, ``AttentionSpec`` from the backend);
    :func:`headlens.scoring.lse.target_mass` forms ``exp(s_qk - LSE_q)`` at the targets block by block.
    The model runs its fused attention kernel; nothing O(T²) is ever stored.
  - ``"auto"`` (default): sparse when the backend supports it and the dense pattern of a batch
    would be large (:func:`choose_path`), dense otherwise. Which path ran goes into the provenance.
* **Reduce inside the hook.** What survives a layer is ``(B, H, D)`` float64.
* **One driver, two statistics.** :func:`run_batches` owns batching, hooks, paths and the early
  stop; a :class:`Reducer` says what to compute: attention mass here, the top-1 key in
  :mod:`headlens.scoring.top1`.
* **Per-prompt sums**, not just totals, are kept (``P x L x H x D`` float64, tiny) so that
  statistics can bootstrap over prompts, and so a scan can be split and summed.
* **Right padding, uneven lengths.** Targets never point at pads and pad rows have no target;
  bidirectional models also get an ``attention_mask``. Causal models see no pads from real rows.
* The forward pass stops after the last layer is reduced: logits are never needed.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headlens.detectors.base import Detector
from headlens.errors import ConfigError, HeadlensError
from headlens.models.attention import AttentionSpec
from headlens.models.vocab import vocab
from headlens.probes.base import Probe, ProbeBatch, collate
from headlens.scoring.defaults import SCAN_PATHS
from headlens.scoring.lse import heads_first

Progress = Callable[[int], None]  # called with the number of prompts just scanned
DENSE_BYTES = 256 * 2**20  # auto: above this many bytes of one layer's dense pattern, go sparse
DENSE_MAX_T = 512  # auto: from this many positions on, go sparse (measured crossover 256..512, README)


@dataclass
class DetectorStats:
    """Per-prompt statistics of one detector on one probe.

    Attributes:
        sums: ``(P, L, H)`` float64: attention mass on the targets, summed over the prompt's rows.
        counts: ``(P,)`` float64: rows with a target in each prompt.
        baseline: ``(P,)`` float64: uniform attention's mass on the targets, summed the same way.
    """

    sums: torch.Tensor
    counts: torch.Tensor
    baseline: torch.Tensor


class _ScanDone(Exception):
    """Raised after the last layer has been reduced: the rest of the forward is waste."""


def attention_specs(model: Any) -> list[AttentionSpec] | None:
    """The backend's per-layer :class:`AttentionSpec` (None: it offers only the dense pattern)."""
    fn = getattr(model, "attention_specs", None)
    return fn() if callable(fn) else None


def choose_path(path: str, model: Any, batch_shape: tuple[int, int], supported: bool | None = None) -> str:
    """``"dense"`` or ``"sparse"`` for a batch of ``(B, T)`` tokens under ``path``.

    ``supported``: whether the backend offers q and k hooks, when the caller already knows
    (None: ask the backend for its attention specs).
    """
    if path not in SCAN_PATHS:
        raise ConfigError(f"unknown scan path {path!r}; expected one of {', '.join(SCAN_PATHS)}")
    if supported is None:
        supported = attention_specs(model) is not None
    if path == "sparse" and not supported:
        raise HeadlensError(f"scan_path='sparse' needs q and k hooks; the backend of "
                            f"{getattr(model, 'name', '?')!r} offers only the attention pattern")
    if path != "auto":
        return path
    B, T = batch_shape
    dense_bytes = 4 * B * model.n_heads * T * T
    return "sparse" if supported and (T >= DENSE_MAX_T or dense_bytes > DENSE_BYTES) else "dense"


def _fused(model: Any, chosen: str) -> contextlib.AbstractContextManager[Any]:
    """The backend's fused-attention mode for a sparse batch (bridged HF models), else nothing to do."""
    fused = getattr(model, "fused_attention", None)
    return fused() if chosen == "sparse" and callable(fused) else contextlib.nullcontext()


@dataclass(frozen=True)
class Reducer:
    """What one engine computes from a batch; :func:`run_batches` drives the forward passes.

    Attributes:
        prepare: ``batch -> (state, counts (B, D), baseline (B, D))``; ``state`` (the batch's targets)
            is shared by every layer's reduction.
        from_pattern: ``(pattern (B, H, Q, K), state) -> (B, H, D)`` float64, the dense path.
        from_qk: ``(q (B, H, T, d), k (B, H_kv, T, d), spec, state) -> (B, H, D)`` float64, the sparse path.
    """

    prepare: Callable[[ProbeBatch], tuple[dict[str, Any], torch.Tensor, torch.Tensor]]
    from_pattern: Callable[[torch.Tensor, dict[str, Any]], torch.Tensor]
    from_qk: Callable[[torch.Tensor, torch.Tensor, AttentionSpec, dict[str, Any]], torch.Tensor]


def run_batches(model: Any, probe: Probe, detectors: Sequence[Detector], reducer: Reducer, batch_size: int,
                progress: Progress | None, path: str, info: dict[str, Any] | None) -> dict[str, DetectorStats]:
    """Run ``probe`` batch by batch, reduce every layer with ``reducer`` inside its hook, keep per-prompt sums."""
    L, H, P, D = model.n_layers, model.n_heads, len(probe), len(detectors)
    sums = torch.zeros(P, L, H, D, dtype=torch.float64)
    counts = torch.zeros(P, D, dtype=torch.float64)
    base = torch.zeros(P, D, dtype=torch.float64)
    v = vocab(model)
    pad_id = getattr(model.tokenizer, "pad_token_id", None)
    pad_id = int(pad_id) if pad_id is not None else v.ordinary[0]
    specs = attention_specs(model)
    state: dict[str, Any] = {}
    paths: list[str] = []

    def dense_hook(layer: int) -> Callable[..., None]:
        def reduce_layer(pattern: torch.Tensor, hook: Any) -> None:  # (B, H, Q, K)
            state["out"][:, layer] = reducer.from_pattern(pattern, state)
            if layer == L - 1:
                raise _ScanDone

        return reduce_layer

    def sparse_hook(layer: int, which: str) -> Callable[..., None]:
        spec = specs[layer]

        def capture(x: torch.Tensor, hook: Any) -> None:
            state[which] = heads_first(x, spec.layout)  # (B, H, T, d)
            if "q" in state and "k" in state:
                state["out"][:, layer] = reducer.from_qk(state.pop("q"), state.pop("k"), spec, state)
                if layer == L - 1:
                    raise _ScanDone

        return capture

    dense_hooks = [(f"blocks.{layer}.attn.hook_pattern", dense_hook(layer)) for layer in range(L)]
    sparse_hooks = [] if specs is None else [
        (name, sparse_hook(layer, which)) for layer, s in enumerate(specs)
        for name, which in ((s.q_hook, "q"), (s.k_hook, "k"))]
    with torch.inference_mode():
        for start in range(0, P, batch_size):
            rows = range(start, min(start + batch_size, P))
            batch = collate(probe, rows, model.is_causal, v.special, pad_id, model.device)
            chosen = choose_path(path, model, tuple(batch.tokens.shape), supported=specs is not None)
            paths.append(chosen)
            batch_state, c, b = reducer.prepare(batch)
            state.update(batch_state, key_valid=None if model.is_causal else batch.valid,
                         out=torch.zeros(len(rows), L, H, D, dtype=torch.float64, device=batch.tokens.device))
            mask = None if model.is_causal else batch.valid.long()
            try:
                with _fused(model, chosen), model.hooks(sparse_hooks if chosen == "sparse" else dense_hooks):
                    model.forward(batch.tokens, attention_mask=mask)
            except _ScanDone:
                pass
            else:  # a hook never fired: the scores would be silent zeros
                last = dense_hooks[-1][0] if chosen == "dense" else " / ".join(n for n, _ in sparse_hooks[-2:])
                raise HeadlensError(f"the forward pass of {getattr(model, 'name', '?')!r} never fired {last}; "
                                    f"its backend cannot give the {chosen} scan what it reads")
            sums[start:start + len(rows)] = state["out"].cpu()
            counts[start:start + len(rows)] = c.cpu()
            base[start:start + len(rows)] = b.cpu()
            state.clear()  # drop this batch's targets before the next one is built
            if progress is not None:
                progress(len(rows))
    if info is not None:
        info["scan_path"] = "+".join(sorted(set(paths))) or "none"
    return {d.name: DetectorStats(sums[..., i], counts[:, i], base[:, i]) for i, d in enumerate(detectors)}


def n_batches(n_prompts: int, batch_size: int) -> int:
    return math.ceil(n_prompts / batch_size)
