"""The lesson behind headlens, computed on a real model and the user's own text.

Four steps, each a pure function the dashboard's Learn view draws (and tests check without a
browser):

1. :func:`split_step`: the real ``q`` of one layer on the text, ``(B, T, d_model)`` →
   ``(B, T, H, d_head)`` → ``(B, H, T, d_head)``, and each head's pattern.
2. :func:`bug_step`: a copy of the model with a silent bug planted (``headlens.doctor.inject``),
   its patterns and loss on the text next to the clean model's, and the doctor's verdict on
   the broken layer.
3. :func:`head_count_step`: the checkpoint read back with every divisor of ``d_model`` as
   ``n_heads`` (``headlens.doctor.checkpoint``): loss and patterns for each.
4. :func:`head_examples`: each labelled head with one example from the text: the query where
   it puts the most weight on its detector's target.

Steps 1, 2 and 3 need headlens' own GPT (a bridged model has no attention code of ours to split
or break): they raise ``ConfigError`` saying so; step 4 works on any model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from headlens.errors import ConfigError, ProbeError
from headlens.models.token_text import readable_tokens


def _native(model: Any, what: str) -> None:
    if not hasattr(getattr(model, "transformer", None), "h"):
        raise ConfigError(f"{what} needs headlens' native GPT; {getattr(model, 'name', 'this model')} is "
                          f"{type(model).__name__} (bridged through TransformerLens)")


def _np(t: torch.Tensor) -> np.ndarray:
    """A float32 numpy copy of ``t`` from any dtype (bfloat16 has no numpy type) and device."""
    return t.detach().float().cpu().numpy()


def _tokens(model: Any, text: str) -> torch.Tensor:
    if not text or not text.strip():
        raise ProbeError("the text is empty; type something for the model to read")
    return model.to_tokens(text)  # (1, T); ProbeError past the context or outside the alphabet


@torch.inference_mode()
def text_loss(model: Any, tokens: torch.Tensor) -> np.ndarray:
    """Next-token loss (nats) at each position of ``tokens`` ``(1, T)``: ``(T - 1,)``."""
    logits = model(tokens)  # (1, T, d_vocab)
    return F.cross_entropy(logits[0, :-1].float(), tokens[0, 1:], reduction="none").cpu().numpy()


# -- step 1: the split ------------------------------------------------------------------------
@dataclass(frozen=True)
class SplitStep:
    """One layer's queries on the text, before and after the head split, and its patterns."""

    layer: int
    tokens: list[str]
    q: np.ndarray  # (T, d_model): c_attn's query third, the batch of one dropped
    q_split: np.ndarray  # (T, H, d_head): q.view(B, T, H, d_head)[0]
    q_heads: np.ndarray  # (H, T, d_head): .transpose(1, 2)[0]: each head's own (T, d_head) slice
    patterns: np.ndarray  # (H, T, T)
    k: np.ndarray | None = None  # (T, H_kv * d_head): the keys, on a bridged model (grouped-query attention)
    k_heads: np.ndarray | None = None  # (H_kv, T, d_head)
    rope: bool = False  # q and k are rotated by position (RoPE) after the split

    @property
    def n_heads(self) -> int:
        return self.q_heads.shape[0]

    @property
    def n_kv_heads(self) -> int:
        return self.n_heads if self.k_heads is None else self.k_heads.shape[0]

    @property
    def d_head(self) -> int:
        return self.q_heads.shape[2]


@torch.inference_mode()
def split_step(model: Any, text: str, layer: int = 0) -> SplitStep:
    """The multi-head split of layer ``layer``'s queries, with the real tensors of ``text``."""
    _native(model, "showing the split")
    tokens = _tokens(model, text)
    attn, block = model.transformer.h[layer].attn, model.transformer.h[layer]
    names = (f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.attn.hook_pattern")
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    x = block.ln_1(cache[names[0]])  # (B, T, d_model): what the attention reads
    B, T, D = x.shape
    q = attn.c_attn(x).split(D, dim=2)[0]  # (B, T, d_model)
    q_split = q.view(B, T, attn.n_heads, attn.d_head)  # (B, T, H, d_head): axis 2 is the head
    q_heads = q_split.transpose(1, 2)  # (B, H, T, d_head): each head attends on its own
    return SplitStep(layer, readable_tokens(model, tokens), _np(q[0]), _np(q_split[0]), _np(q_heads[0]),
                     _np(cache[names[1]][0]))


# -- step 2: the silent bugs ------------------------------------------------------------------
@dataclass
class BugStep:
    """The clean and the bugged model on the same text, and what the doctor says."""

    bug: str
    looks_like: str
    tokens: list[str]
    clean_loss: float  # mean next-token loss (nats) on the text
    bugged_loss: float
    token_diff: np.ndarray  # (T - 1,) bugged - clean loss per predicted token
    clean_patterns: np.ndarray  # (H, T, T) at the layer shown
    bugged_patterns: np.ndarray  # (A, S, S): what the bug makes of the pattern
    pattern_axes: str  # what A and S are under the bug
    diagnosis: str | None  # the doctor's bug name for the broken layer
    verdict: str  # the doctor's one-line verdict
    report: str  # the doctor's full report
    doctor: dict[str, Any] = field(default_factory=dict)


_AXES = {"no_transpose": "(T, H, H): for every position, heads attend over heads; no token sees another",
         "head_first_view": "(H, T, T) by shape, but each 'head' is rows of several positions and heads mixed",
         "standard": "(H, T, T): heads x query x key, as they should be"}


def bug_step(model: Any, text: str, bug: str, layer: int = 0) -> BugStep:
    """Plant ``bug`` (a key of ``headlens.doctor.inject.LESSON_BUGS``) in a copy of ``model``."""
    from headlens.doctor import check_attention
    from headlens.doctor.inject import LESSON_BUGS, inject_bug

    _native(model, "injecting a bug")
    tokens = _tokens(model, text)
    broken = inject_bug(model, bug)  # outside inference mode: the doctor copies and edits its weights
    name = f"blocks.{layer}.attn.hook_pattern"
    with torch.inference_mode():
        _, clean = model.run_with_cache(tokens, names_filter=name)
        _, bugged = broken.run_with_cache(tokens, names_filter=name)
        clean_loss, bugged_loss = text_loss(model, tokens), text_loss(broken, tokens)
    report = check_attention(broken.transformer.h[layer].attn, d_model=model.cfg.d_model,
                             n_heads=model.cfg.n_heads, causal=True)
    verdict = (f"{report.diagnosis}: {report.diagnosis_title}" if report.diagnosis
               else report.diagnosis_title)
    return BugStep(
        bug=bug, looks_like=LESSON_BUGS[bug][0], tokens=readable_tokens(model, tokens),
        clean_loss=float(clean_loss.mean()), bugged_loss=float(bugged_loss.mean()),
        token_diff=bugged_loss - clean_loss, clean_patterns=_np(clean[name][0]),
        bugged_patterns=_np(bugged[name][0]),
        pattern_axes=_AXES[broken.transformer.h[layer].attn.recipe.split], diagnosis=report.diagnosis,
        verdict=verdict, report=str(report), doctor=report.to_dict(),
    )


# -- step 3: the head count -------------------------------------------------------------------
@dataclass(frozen=True)
class HeadCountRow:
    n_heads: int
    d_head: int
    loss: float  # mean next-token loss (nats) on the text, weights split into n_heads heads
    patterns: np.ndarray  # (n_heads, T, T) at the layer shown


def checkpoint_source(ref: str) -> Path | None:
    """The weights file (or Hugging Face GPT-2 directory) behind a model reference, if it has one."""
    from headlens.zoo import ZOO

    if ref in ZOO:
        return ZOO[ref].path
    if ref.startswith("hf:"):
        return Path(ref[3:]).expanduser()
    path = Path(ref).expanduser()
    return path if path.suffix == ".safetensors" and path.is_file() else None


@torch.inference_mode()
def head_count_step(source: str | Path, text: str, layer: int = 0,
                    model: Any = None) -> tuple[list[str], list[HeadCountRow]]:
    """The checkpoint at ``source`` split into every divisor of ``d_model`` heads, on ``text``.

    ``model``, the model loaded from ``source`` (native or bridged), tokenizes the text when given:
    a Hugging Face directory's own tokenizer then reads it, whatever tokenizer the doctor finds.
    Returns the text's tokens and one row per head count (ascending).
    """
    from headlens.doctor.bugs import divisors
    from headlens.doctor.checkpoint import model_with_heads, read_weights, text_tokens

    w = read_weights(source)
    if model is not None:
        tokens = _tokens(model, text)[:, : w.config.n_ctx].cpu()  # (1, T), BOS first
    else:
        (tokens,) = text_tokens(w, [text])[:1]  # (1, T), BOS first
    name = f"blocks.{layer}.attn.hook_pattern"
    rows = []
    for h in divisors(w.config.d_model):
        split = model_with_heads(w, h)  # the checkpoint's weights read as h heads
        _, cache = split.run_with_cache(tokens, names_filter=name)
        loss = float(text_loss(split, tokens).mean())
        rows.append(HeadCountRow(h, w.config.d_model // h, loss, _np(cache[name][0])))
    if model is not None:
        str_tokens = readable_tokens(model, tokens)
    elif w.tokenizer is not None:
        str_tokens = [w.tokenizer.str_token(int(i)) for i in tokens[0]]
    else:
        str_tokens = [str(int(i)) for i in tokens[0]]
    return str_tokens, rows


# -- step 4: what heads specialise in ---------------------------------------------------------
@dataclass(frozen=True)
class HeadExample:
    """One labelled head and the position of the text that shows its job best."""

    layer: int
    head: int
    detector: str
    score: float
    ci_low: float
    ci_high: float
    query: int | None  # the query position of the example; None when the text has no target for it
    keys: tuple[int, ...]  # its target key position(s)
    weight: float  # attention from query to the target(s)
    row: np.ndarray | None  # (T,) the head's attention row at the query


def specialists(scores: Any, per_type: int = 3, types: Sequence[str] | None = None) -> dict[str, list[Any]]:
    """The labelled heads by head type: each head under its strongest label (the library's order,
    :func:`headlens.scoring.table.labelled_heads`), the ``per_type`` strongest of each type, the types in the
    order of their strongest head (only ``types``, when given)."""
    from headlens.scoring.table import labelled_heads

    best: dict[tuple[int, int], Any] = {}
    rows = list(labelled_heads(scores).itertuples())
    # a top-1 label (retrieval) reads needle prompts, not this text: a head's other labels come first
    for row in sorted(rows, key=lambda r: _kind(str(r.detector)) == "top1"):  # stable: table order otherwise
        best.setdefault((int(row.layer), int(row.head)), row)
    out: dict[str, list[Any]] = {}
    for row in best.values():
        if types is None or str(row.detector) in types:
            out.setdefault(str(row.detector), []).append(row)
    return {name: heads[:per_type] for name, heads in out.items()}


def head_examples(model: Any, text: str, scores: Any, per_type: int = 3,
                  types: Sequence[str] | None = None) -> tuple[list[str], list[HeadExample]]:
    """The strongest labelled heads of each type (:func:`specialists`), each with its best example on ``text``.

    The example is the query where the head puts the most attention on what its detector
    says it should attend to (the previous token, the token after an earlier copy, the
    matching bracket ...), computed with the detector's own target function.
    """
    from headlens.detectors import get_detector
    from headlens.detectors.base import as_targets
    from headlens.models.vocab import vocab
    from headlens.probes.base import collate
    from headlens.probes.text import text_prompts
    probe = text_prompts(model, [text])
    v = vocab(model)
    pad_id = getattr(model.tokenizer, "pad_token_id", None)
    batch = collate(probe, [0], model.is_causal, v.special, int(pad_id) if pad_id is not None else v.ordinary[0],
                    model.device)
    chosen = [row for heads in specialists(scores, per_type, types).values() for row in heads]
    layers = sorted({int(r.layer) for r in chosen})
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in layers]
    with torch.inference_mode():
        _, cache = model.run_with_cache(batch.tokens, names_filter=lambda n: n in names)
    out = []
    for r in chosen:
        pattern = cache[f"blocks.{int(r.layer)}.attn.hook_pattern"][0, int(r.head)].double().cpu()  # (Q, K)
        det = get_detector(str(r.detector))
        query, keys, weight = None, (), float("nan")
        if det.targets is not None:
            targets = as_targets(det.targets(batch), batch)[0].cpu()  # (Q, M) key indices, -1 = none
            query, keys, weight = _best_target(pattern, targets, model.is_causal)
        out.append(HeadExample(int(r.layer), int(r.head), str(r.detector), float(r.score), float(r.ci_low),
                               float(r.ci_high), query, keys, weight,
                               pattern[query].numpy() if query is not None else None))
    return readable_tokens(model, batch.tokens), out


def _kind(name: str) -> str:
    from headlens.detectors import get_detector
    from headlens.errors import DetectorError

    try:
        return get_detector(name).kind
    except DetectorError:  # an annotated head type of the user's own
        return "annotated"


def _best_target(pattern: torch.Tensor, target: torch.Tensor,
                 causal: bool) -> tuple[int | None, tuple[int, ...], float]:
    """(query, target keys, weight on them) where the head's weight on its target most exceeds
    what uniform attention would put there (so the first positions, which see one or two keys
    and trivially attend to them, do not win)."""
    Q, K = pattern.shape
    n_visible = torch.arange(1, Q + 1, dtype=pattern.dtype) if causal else torch.full((Q,), float(K))  # (Q,)
    mask = torch.zeros(Q, K + 1, dtype=torch.bool)  # the extra column takes the -1 paddings
    mask.scatter_(1, torch.where(target >= 0, target, K), True)  # target (Q, M) key indices, -1 = none
    mask = mask[:, :K]  # (Q, K): True at each query's target keys
    has = mask.any(1)  # (Q,)
    if not bool(has.any()):
        return None, (), float("nan")
    on = (pattern * mask).sum(1)  # (Q,) weight on the targets
    excess = (on - mask.sum(1) / n_visible).masked_fill(~has, -2.0)  # (Q,)
    q = int(excess.argmax())
    return q, tuple(int(k) for k in mask[q].nonzero()[:, 0]), float(on[q])
