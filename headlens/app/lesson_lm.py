"""The lesson on a real language model (SmolLM2, or any Hugging Face causal LM): pure functions the Learn view
draws, tested without a browser.

1. :func:`split_step`: the bridged model's own queries and keys of one layer on the user's text, with
   grouped-query attention: ``q`` ``(T, H d)`` split into ``H`` heads, ``k`` ``(T, H_kv d)`` into ``H_kv``, each
   query head reading key/value head ``h // (H / H_kv)`` (what ``repeat_kv`` does).
2. :func:`bug_step`: a silent bug planted at the attention function of a plain ``transformers`` copy of the same
   weights (:mod:`headlens.doctor.hf_bugs`): the loss on the text and the model's greedy continuation of a
   prompt, clean and bugged, and the doctor's check of the broken layer's attention function.
3. :func:`layout_row` / :func:`doctor_check`: the weights loaded with another head layout (3 query heads and 1
   key/value head of width 192 instead of 9, 3 of 64 for SmolLM2: the same matrix shapes), which
   ``transformers`` loads without a word; its loss and continuation; and ``headlens doctor`` on the directory,
   limited to the two layouts (the full check tries every layout on more text, minutes on two cores).

The copies are built from the directory the bridged model was booted from (``model.tokenizer_dir``: the GGUF
cache folder for ``smollm2``, the ``hf:`` directory), in float32 with eager attention, as the doctor builds them.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from headlens.app.lesson import SplitStep, _np, _tokens
from headlens.errors import CheckpointError, ConfigError
from headlens.models.token_text import readable_tokens

EIFFEL = "The Eiffel Tower is in the city of"  # SmolLM2 continues it with " Paris"; broken, with noise
N_NEW = 8  # tokens a continuation adds


# -- step 1: the split with grouped-query attention ---------------------------------------------
@torch.inference_mode()
def split_step(model: Any, text: str, layer: int = 0) -> SplitStep:
    """Layer ``layer``'s queries and keys on ``text``, read from the bridged model's ``hook_q`` / ``hook_k``
    (the projections' outputs viewed as heads, before RoPE), and its patterns."""
    tokens = _tokens(model, text)
    names = [f"blocks.{layer}.attn.hook_{n}" for n in ("q", "k", "pattern")]
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    q, k = cache[names[0]][0], cache[names[1]][0]  # (T, H, d_head), (T, H_kv, d_head)
    T, H, d = q.shape
    return SplitStep(layer, readable_tokens(model, tokens), _np(q.reshape(T, H * d)), _np(q), _np(q.transpose(0, 1)),
                     _np(cache[names[2]][0]), k=_np(k.reshape(T, -1)), k_heads=_np(k.transpose(0, 1)),
                     rope=f"blocks.{layer}.attn.hook_rot_q" in model.hook_dict)


# -- the plain transformers copy --------------------------------------------------------------------
def model_directory(model: Any) -> Path:
    """The Hugging Face directory a bridged model was booted from; ``ConfigError`` when it has none."""
    folder = Path(str(getattr(model, "tokenizer_dir", "") or ""))
    if not getattr(model, "tokenizer_dir", None) or not (folder / "config.json").is_file():
        raise ConfigError(f"{getattr(model, 'name', 'this model')} has no Hugging Face directory to rebuild it from")
    return folder


@contextlib.contextmanager
def _heard() -> Iterator[list[str]]:
    """What ``transformers`` says while loading (its warnings and log lines), to show that it says nothing."""
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    handler, log = Keep(level=logging.WARNING), logging.getLogger("transformers")
    log.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield said
        said.extend(str(w.message) for w in caught)
    finally:
        log.removeHandler(handler)


def build(directory: Path, layout: Any = None) -> tuple[Any, list[str]]:
    """The directory's weights in a ``transformers`` model with ``layout`` (default: its config's), float32 with
    eager attention, and what ``transformers`` said while loading them."""
    from headlens.doctor.families import build as build_layout
    from headlens.doctor.families import claimed_layout, read_config

    cfg = read_config(directory)
    layout = layout or claimed_layout(cfg)
    with _heard() as said:
        hf = build_layout(directory, cfg, layout, attn_implementation="eager")  # patterns come back
    if hf is None:
        raise CheckpointError(f"the weights in {str(directory)!r} do not load as {layout}")
    return hf, said


def layouts(directory: Path) -> tuple[Any, list[Any]]:
    """The config's head layout and every layout with the same projection widths (fewest query heads first)."""
    from headlens.doctor.families import candidate_layouts, claimed_layout, read_config

    cfg = read_config(directory)
    config = claimed_layout(cfg)
    return config, candidate_layouts(cfg, config)


# -- losses and continuations -------------------------------------------------------------------------
@torch.inference_mode()
def text_losses(hf: Any, ids: torch.Tensor, layer: int | None = None) -> tuple[np.ndarray, torch.Tensor | None]:
    """Next-token loss (nats) at every position of ``ids`` ``(1, T)``, ``(T - 1,)``, and with ``layer`` that layer's
    attention pattern ``(H, T, T)`` from the same pass."""
    out = hf(ids, output_attentions=layer is not None)
    losses = F.cross_entropy(out.logits[0, :-1].float(), ids[0, 1:], reduction="none").cpu().numpy()  # (T - 1,)
    return losses, (out.attentions[layer][0] if layer is not None and out.attentions else None)


@dataclass(frozen=True)
class Continuation:
    """A prompt and the tokens the model adds to it, greedily."""

    prompt: str
    tokens: list[str]  # the new tokens, as text
    seconds: float

    @property
    def text(self) -> str:
        return "".join(self.tokens)


@torch.inference_mode()
def continue_prompt(hf: Any, model: Any, prompt: str, n_new: int = N_NEW, kv_cache: bool = True) -> Continuation:
    """``hf``'s greedy continuation of ``prompt`` (tokenized by the bridged ``model``, BOS first). A bugged model
    mixes positions, so it runs on the whole sequence at every step (``kv_cache=False``)."""
    t0 = time.perf_counter()
    ids = _tokens(model, prompt).to("cpu")  # (1, T)
    name = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"  # transformers 5 / 4
    new: list[int] = []
    past, step = None, ids
    for _ in range(n_new):
        out = hf(step, use_cache=True, **{name: past}) if kv_cache else hf(ids, use_cache=False)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)  # (1, 1)
        new.append(int(nxt))
        ids = torch.cat([ids, nxt], dim=1)
        past, step = (getattr(out, name), nxt) if kv_cache else (None, ids)
    return Continuation(prompt, readable_tokens(model, torch.tensor([new])), time.perf_counter() - t0)


# -- step 2: a bug in the attention code ----------------------------------------------------------------
@dataclass
class LMBugStep:
    """The clean and the bugged model on the user's text and prompt, and what the doctor says."""

    bug: str
    looks_like: str
    tokens: list[str]
    clean_loss: float
    bugged_loss: float
    token_diff: np.ndarray  # (T - 1,) bugged - clean loss per predicted token
    clean_patterns: np.ndarray  # (H, T, T) at the layer shown
    bugged_patterns: np.ndarray  # (A, S, S): what the bug makes of the pattern
    pattern_axes: str
    clean: Continuation
    bugged: Continuation
    diagnosis: str | None
    verdict: str
    report: str


_AXES = {"missing_transpose_split": "(T, H, H): for every position, heads attend over heads; no token sees another",
         "missing_transpose_merge": "(H, T, T) and right: the output's reshape mixes positions and heads afterwards"}


def bug_step(hf: Any, model: Any, text: str, prompt: str, bug: str, layer: int = 0) -> LMBugStep:
    """Plant ``bug`` (a key of :data:`headlens.doctor.hf_bugs.LM_BUGS`) in every layer of ``hf`` (a plain copy of
    ``model``'s weights; restored afterwards) and compare it with the clean model."""
    from headlens.doctor.bugs import AttentionRecipe, apply_bug
    from headlens.doctor.hf_bugs import (
        LM_BUGS,
        attention_function,
        check_attention_function,
        layer_modules,
        planted,
    )

    ids = _tokens(model, text).to("cpu")  # (1, T)
    clean_loss, clean_patterns = text_losses(hf, ids, layer)  # (T - 1,), (H, T, T)
    clean = continue_prompt(hf, model, prompt)
    seen: dict[int, torch.Tensor] = {}
    with planted(hf, bug, record=lambda i, p: seen.__setitem__(i, p[0])):
        bugged_loss, _ = text_losses(hf, ids)
        bugged_pattern = seen[layer]  # (A, S, S) on the text
        bugged = continue_prompt(hf, model, prompt, kv_cache=False)
    recipe = apply_bug(AttentionRecipe(n_heads=int(hf.config.num_attention_heads)), LM_BUGS[bug][1])
    report = check_attention_function(layer_modules(hf)[layer], attention_function(recipe))
    verdict = f"{report.diagnosis}: {report.diagnosis_title}" if report.diagnosis else report.diagnosis_title
    return LMBugStep(bug, LM_BUGS[bug][0], readable_tokens(model, ids), float(clean_loss.mean()),
                     float(bugged_loss.mean()), bugged_loss - clean_loss, _np(clean_patterns), _np(bugged_pattern),
                     _AXES[bug], clean, bugged, report.diagnosis, verdict, str(report))


# -- step 3: the wrong head count -------------------------------------------------------------------------
@dataclass(frozen=True)
class LayoutRow:
    """The weights split into one head layout: what loading said, the loss on the text, the continuation."""

    layout: Any  # headlens.doctor.families.HeadLayout
    tokens: list[str]  # the text's tokens
    loaded: str  # what transformers said while loading (empty: nothing)
    loss: float
    token_losses: np.ndarray  # (T - 1,)
    patterns: np.ndarray  # (n_heads, T, T) at the layer shown
    continuation: Continuation


def layout_row(directory: Path, model: Any, text: str, prompt: str, layout: Any = None, layer: int = 0,
               hf: Any = None) -> LayoutRow:
    """Load the weights in ``directory`` as ``layout`` (``hf``: an already built copy with it) and run it."""
    said: list[str] = []
    if hf is None:
        hf, said = build(directory, layout)
    ids = _tokens(model, text).to("cpu")  # (1, T)
    losses, patterns = text_losses(hf, ids, layer)  # (T - 1,), (H, T, T)
    from headlens.doctor.families import claimed_layout

    layout = layout or claimed_layout(hf.config)
    return LayoutRow(layout, readable_tokens(model, ids), "; ".join(s for s in said if s.strip()), float(losses.mean()),
                     losses, _np(patterns), continue_prompt(hf, model, prompt))


DOCTOR_ROWS, DOCTOR_SEQ_LEN = 4, 64  # the lesson's check: a few rows of each evaluation source


def doctor_check(directory: Path, n_heads: int, config_heads: int) -> tuple[str, dict[str, Any]]:
    """``headlens doctor`` on ``directory`` as if its config said ``n_heads`` (``check_checkpoint(n_heads=...)``),
    trying only that head count and the config's, on :data:`DOCTOR_ROWS` rows of :data:`DOCTOR_SEQ_LEN` tokens of
    each evaluation source: the report's text and its fields (``seconds`` says how long it took)."""
    from headlens.doctor import check_checkpoint

    with _heard():
        report = check_checkpoint(directory, n_heads=n_heads, candidates=sorted({n_heads, config_heads}),
                                  n_rows=DOCTOR_ROWS, seq_len=DOCTOR_SEQ_LEN)
    return str(report), report.to_dict()
