"""What the dashboard computes besides widgets: head ids, selection syncing, example texts,
patterns, per-token losses, ablations and training snapshots.

The page (``headlens/app/page.py``) holds layout and widgets only; everything it computes
comes from here, from :mod:`headlens.app.cache` (the Streamlit-cached wrappers) or from the
library, so it can be tested without a browser. Nothing here imports Streamlit.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from headlens.app import MODEL_ENV as MODEL_ENV  # re-exported: the page and its tests read these here
from headlens.app.picker import CUSTOM_CHOICE as CUSTOM_CHOICE
from headlens.app.picker import fingerprint as fingerprint
from headlens.app.picker import initial_model as initial_model
from headlens.app.picker import minilm_installed as minilm_installed
from headlens.app.picker import model_choices as model_choices
from headlens.errors import HeadlensError, ProbeError
from headlens.models.token_text import readable_tokens
from headlens.probes.texts import example_text as alphabet_example_text
from headlens.scoring import defaults
from headlens.scoring.primary import label_order, ranked
from headlens.scoring.table import COLUMNS, head_labels

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

Head = tuple[int, int]

LABELS_CHOICE = "strongest label"  # grid colouring: each head's top label (type as colour, strength as intensity)
_HEAD_RE = re.compile(r"^\s*L(\d+)\s*H(\d+)\s*$", re.IGNORECASE)

# shared scan settings: small, so a first view of a model is quick on a laptop CPU
DEFAULT_N_PROMPTS = defaults.N_PROMPTS  # the CLI's default scan, so the dashboard shows the same labels
TRAINING_DETECTORS = ("previous_token", "induction", "bracket_matching", "first_token")
# what the heads are scored on: headlens' generated probes, or windows of real Python source
SCORE_SOURCES = {"generated probes": None, "real Python (stdlib)": "stdlib"}
CORPUS_SEQ_LEN = 128  # tokens per corpus window (capped by the model's context)


# -- head ids and selections ------------------------------------------------------------------
def format_head(layer: int, head: int) -> str:
    """``(1, 2) -> "L1H2"``.

    >>> format_head(1, 2)
    'L1H2'
    """
    return f"L{int(layer)}H{int(head)}"


def parse_head(text: str) -> Head:
    """``"L1H2" -> (1, 2)``; a ``HeadlensError`` naming the text when it is not a head id.

    >>> parse_head("L1H2")
    (1, 2)
    """
    match = _HEAD_RE.match(str(text))
    if not match:
        raise HeadlensError(f"{text!r} is not a head id; expected L{{layer}}H{{head}}, e.g. 'L1H2'")
    return int(match.group(1)), int(match.group(2))


def all_heads(n_layers: int, n_heads: int) -> list[str]:
    """Every head id of a model in layer-major order."""
    return [format_head(layer, head) for layer in range(n_layers) for head in range(n_heads)]


def heads_from_selection(selection: Any) -> list[str]:
    """Head ids picked in the head grid, from Streamlit's plotly selection state.

    Accepts the chart's state (``{"selection": {"points": [...]}}``), the inner selection
    dict, or a list of points; a point names its head by ``customdata = [layer, head, ...]``.

    >>> heads_from_selection({"selection": {"points": [{"customdata": [1, 0, "L1H0"]}]}})
    ['L1H0']
    """
    if selection is None:
        return []
    if isinstance(selection, Mapping) or hasattr(selection, "get"):
        inner = selection.get("selection", selection)
        points = inner.get("points", []) if hasattr(inner, "get") else []
    else:
        points = selection
    out: list[str] = []
    for point in points or []:
        custom = point.get("customdata") if hasattr(point, "get") else None
        if custom is None or len(custom) < 2:
            continue
        head_id = format_head(int(custom[0]), int(custom[1]))
        if head_id not in out:
            out.append(head_id)
    return out


def sync_selection(widget: Sequence[str], chart: Sequence[str], last_chart: Sequence[str]) -> list[str]:
    """The heads the multiselect should show after a rerun.

    The multiselect is the source of truth; a click in the grid overrides it only when the
    grid's selection is new (non-empty and different from what the grid reported last time),
    so changing the multiselect by hand is not undone by a stale grid selection.

    >>> sync_selection(["L0H0"], ["L1H1"], [])
    ['L1H1']
    >>> sync_selection(["L0H0"], ["L1H1"], ["L1H1"])
    ['L0H0']
    """
    if chart and list(chart) != list(last_chart):
        return list(chart)
    return list(widget)


# -- models -----------------------------------------------------------------------------------
def release_hooks(model: Any) -> list[str]:
    """Remove hooks left on a shared model (there should be none); returns what was removed."""
    leaked = list(model.active_hooks()) if hasattr(model, "active_hooks") else []
    if leaked and hasattr(model, "reset_hooks"):
        model.reset_hooks()
    return leaked


@dataclass(frozen=True)
class TableShape:
    """What the grid needs of a model (name, layers, heads), read from a scores table's provenance: the page
    draws a zoo model's grid from its shipped scores with it before the model (and torch) has loaded."""

    name: str
    n_layers: int
    n_heads: int

    @classmethod
    def of(cls, scores: pd.DataFrame) -> TableShape:
        """The shape a scores table's provenance records.

        >>> import pandas as pd
        >>> table = pd.DataFrame()
        >>> table.attrs.update(model="code", n_layers=3, n_heads=4)
        >>> TableShape.of(table)
        TableShape(name='code', n_layers=3, n_heads=4)
        """
        a = scores.attrs
        return cls(str(a["model"]), int(a["n_layers"]), int(a["n_heads"]))


def model_summary(model: Any) -> str:
    """One line: size and kind of the model."""
    cfg = model.cfg
    kind = "causal" if model.is_causal else "bidirectional"
    return (f"{model.n_layers} layers x {model.n_heads} heads, d_model {cfg.d_model}, "
            f"n_ctx {cfg.n_ctx}, {kind}")


# -- computations the app shows (cached in the app layer) -------------------------------------
# what a language model's text box starts with: prose it predicts well (a bug's loss shows against it), a sentence
# said twice (induction heads), names repeated (duplicate-token heads) and line breaks, in under 40 tokens (so the
# Learn view's side-by-side patterns show all of it; longer texts get a token-window slider)
LM_TEXT = ("The Eiffel Tower is in the city of Paris.\n"
           "Harry gave Sally a map, and Sally thanked Harry.\n"
           "The Eiffel Tower is in the city of Paris.")


def example_text(model: Any) -> str:
    """The text box's first text: :data:`LM_TEXT` for a causal language model with a Hugging Face tokenizer,
    else a text in the model's own alphabet with a repeated segment and nested brackets
    (:func:`headlens.probes.texts.example_text`)."""
    tok = getattr(model, "tokenizer", None)
    if model.is_causal and getattr(model, "output_kind", "logits") == "logits" and \
            hasattr(tok, "convert_tokens_to_string") and model.to_tokens(LM_TEXT).shape[1] <= model.cfg.n_ctx:
        return LM_TEXT
    return alphabet_example_text(model)


def validate_text(model: Any, text: str) -> Any:
    """Tokens ``(1, T)`` for the user's text, or a ``ProbeError`` saying what is wrong with it."""
    if not text or not text.strip():
        raise ProbeError("the text is empty; type something for the model to read")
    tokens = model.to_tokens(text)  # raises ProbeError past the context or outside the alphabet
    if tokens.shape[1] > model.cfg.n_ctx:
        raise ProbeError(f"text is {tokens.shape[1]} tokens long; this model's context is n_ctx={model.cfg.n_ctx}")
    return tokens


class _Enough(Exception):
    """Raised from the last hook a pass needs: the layers above it (and the unembedding) are not run."""


def head_patterns(model: Any, text: str, heads: Iterable[Head]) -> tuple[list[str], dict[Head, np.ndarray]]:
    """The attention patterns ``(query_pos, key_pos)`` of ``heads`` on ``text``, and its tokens. The forward pass
    stops at the highest layer asked for (a head of layer 18 of SmolLM2's 30 costs 19 layers, no unembedding)."""
    import contextlib

    import torch

    heads = list(heads)
    tokens = validate_text(model, text)
    layers = sorted({layer for layer, _ in heads})
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in layers]
    seen: dict[str, Any] = {}

    def keep(x: Any, hook: Any) -> None:
        seen[hook.name] = x.detach()  # (B, H, Q, K)
        if hook.name == names[-1]:
            raise _Enough

    with torch.inference_mode(), contextlib.suppress(_Enough), model.hooks([(n, keep) for n in names]):
        model(tokens)  # the hooks are removed before _Enough is swallowed
    out = {}
    for layer, head in heads:
        out[(layer, head)] = seen[f"blocks.{layer}.attn.hook_pattern"][0, head].float().cpu().numpy()  # (Q, K)
    return readable_tokens(model, tokens), out


def token_losses(model: Any, tokens: Any) -> np.ndarray:
    """Next-token loss (nats) at every position but the last, for a causal LM: ``(T - 1,)``."""
    import torch
    import torch.nn.functional as F

    if not model.is_causal or getattr(model, "output_kind", "logits") != "logits":
        raise ProbeError("per-token loss needs a causal language model with an output head")
    with torch.inference_mode():
        logits = model(tokens)  # (1, T, d_vocab)
        loss = F.cross_entropy(logits[0, :-1].float(), tokens[0, 1:], reduction="none")  # (T - 1,)
    return loss.cpu().numpy()


def loss_diff_html(str_tokens: Sequence[str], diff: Sequence[float]) -> str:
    """The text with each predicted token's background coloured by its loss change.

    Red: the ablation made the token harder to predict; blue: easier. The hover title gives
    the change in nats.
    """
    values = [float(d) for d in diff]
    bound = max((abs(v) for v in values if not math.isnan(v)), default=0.0) or 1.0
    spans = []
    from headlens.viz.patterns import BYTE_ESCAPES

    for token, value in zip(str_tokens, values, strict=True):
        token = BYTE_ESCAPES.get(token, token)
        alpha = min(1.0, abs(value) / bound) * 0.85
        rgb = "220,40,40" if value > 0 else "40,90,220"
        shown = html.escape(token).replace("\n", "⏎<br>")
        spans.append(f'<span title="{html.escape(repr(token))}: {value:+.3f} nats" '
                     f'style="background: rgba({rgb},{alpha:.2f}); white-space: pre; '
                     f'font-family: monospace;">{shown}</span>')
    return '<div class="headlens-loss-diff" style="line-height: 1.9;">' + "".join(spans) + "</div>"


def empty_scores() -> pd.DataFrame:
    """A scores table with the schema's columns and no rows (the grid draws it grey)."""
    import pandas as pd

    return pd.DataFrame(columns=list(SCORE_COLUMNS))


HEAD_COLUMNS = ("head", "layer", "index", "kv_head", "labels")  # heads_table's columns before the detectors


def heads_table(scores: pd.DataFrame) -> pd.DataFrame:
    """One row per head: ``head`` (``L1H2``), ``layer``, ``index``, ``kv_head`` (its key/value group),
    ``labels``, one score column per detector."""
    import pandas as pd

    if scores.empty:
        return pd.DataFrame(columns=list(HEAD_COLUMNS))
    wide = scores.pivot_table(index=["layer", "head"], columns="detector", values="score", sort=True)
    wide = wide.reset_index()
    labels = {head: ", ".join(dets) for head, dets in head_labels(scores).items()}  # strongest first, resting last
    pairs = list(zip(wide["layer"].astype(int), wide["head"].astype(int), strict=True))
    kv_col = scores["kv_head"] if "kv_head" in scores.columns else scores["head"]  # older tables: no GQA
    keys = zip(scores["layer"].astype(int), scores["head"].astype(int), strict=True)
    kv = dict(zip(keys, kv_col.astype(int), strict=True))
    front = pd.DataFrame({
        "head": [format_head(layer, head) for layer, head in pairs],
        "layer": [layer for layer, _ in pairs],
        "index": [head for _, head in pairs],
        "kv_head": [kv[pair] for pair in pairs],
        "labels": [labels.get(pair, "") for pair in pairs],
    })
    detectors = wide.drop(columns=["layer", "head"])
    detectors.columns = [str(c) for c in detectors.columns]
    return pd.concat([front, detectors], axis=1)


def preference_rows(scores: pd.DataFrame, detector: str) -> pd.DataFrame:
    """``detector``'s rows when they carry a preference accuracy (annotated head types with
    distractors, e.g. coreference), best first by it (their primary statistic), else an empty frame."""
    if scores.empty or "preference" not in scores.columns:
        return scores.iloc[0:0]
    rows = scores[scores["detector"] == detector]
    return ranked(scores, detector) if rows["preference"].notna().any() else rows.iloc[0:0]


def default_detector(scores: pd.DataFrame) -> str:
    """The detector the grid opens on: induction when some head carries that label, else the label
    of the strongest labelled head (:func:`headlens.scoring.primary.label_order`: preference over chance
    for types with distractors, lift otherwise; resting last), else induction (or the first detector scored)."""
    if scores.empty:
        return "induction"
    detectors = list(dict.fromkeys(scores["detector"]))
    labelled = scores[scores["label"].fillna(False).astype(bool)]
    if "induction" in set(labelled["detector"]):
        return "induction"
    if not labelled.empty:
        return str(label_order(labelled).iloc[0]["detector"])
    return "induction" if "induction" in detectors else detectors[0]


SCORE_COLUMNS = tuple(COLUMNS)  # the scores table's schema, defined once in headlens.scoring.table


def compute_scores(model: Any, n_prompts: int = DEFAULT_N_PROMPTS, seed: int = 0,
                   detectors: Sequence[str] | None = None, corpus: str | None = None,
                   progress: Any = None) -> pd.DataFrame:
    """``headlens.classify`` on ``model`` with the dashboard's scan settings (``corpus``: see ``SCORE_SOURCES``;
    ``progress(done, total, stage)`` after every batch)."""
    classify = _classify()
    window = {"corpus": corpus, "seq_len": CORPUS_SEQ_LEN} if corpus else {}
    table = classify(model, detectors=list(detectors) if detectors else None, n_prompts=n_prompts, seed=seed,
                     progress=progress, **window)
    missing = [c for c in SCORE_COLUMNS if c not in table.columns]
    if missing:
        raise HeadlensError(f"classify returned a table without columns {missing}")
    return table.reset_index(drop=True)


def _classify() -> Any:
    try:
        from headlens.scoring.classification import classify
    except ModuleNotFoundError as err:
        if err.name and err.name.startswith("headlens"):
            raise HeadlensError("head classification is not available in this install (headlens.classify "
                                "is missing)") from None
        raise
    return classify


# -- ablation ---------------------------------------------------------------------------------
def ablation_metrics(model: Any) -> list[str]:
    """The registered metrics that make sense for ``model`` (next-token metrics need a causal LM)."""
    if getattr(model, "output_kind", "logits") != "logits":
        return []
    if not model.is_causal:
        return ["kl"]
    from headlens.interventions.metrics import bracket_ids
    from headlens.probes.ioi import unsupported

    names = ["repeated_loss", "first_half_loss"]
    if len(bracket_ids(model)[0]) >= 2:
        names.append("bracket_accuracy")
    return [*names, "lm_loss", "kl", *(["logit_diff"] if unsupported(model) is None else [])]


def run_ablation(model: Any, heads: Sequence[str], method: str, metric: str, text: str,
                 n_prompts: int = DEFAULT_N_PROMPTS, seed: int = 0) -> dict[str, Any]:
    """Ablate ``heads`` together: the metric change (with a random-heads control) and per-token losses.

    The control heads are random heads of the same layers, or, when the selection fills its
    layers (all of a layer: nothing left to draw there), random heads anywhere else in the model.

    Returns:
        ``effects`` (rows ``heads, metric, delta, ci_low, ci_high`` for the heads and the control),
        ``sweep`` (the raw ``headlens.interventions.sweep`` row), ``control`` (``"layer"`` or ``"model"``), and
        ``tokens`` / ``clean`` / ``ablated`` / ``diff`` for the user's text, or ``token_note``
        saying why they are missing.
    """
    import numpy as np
    import pandas as pd

    from headlens.interventions.ablation import ablate
    from headlens.interventions.sweep import sweep

    if not heads:
        raise HeadlensError("choose at least one head to ablate")
    prompts = None if getattr(model.tokenizer, "kind", None) == "byte" or metric not in ("lm_loss", "kl") \
        else [text]
    row = sweep(model, groups=[",".join(heads)], method=method, metrics=[metric], prompts=prompts,
                n_prompts=n_prompts, n_control=4, control="auto", n_boot=500, seed=seed, attribution=False).iloc[0]
    effects = pd.DataFrame([
        {"heads": row["heads"], "metric": metric, "delta": row["delta"], "ci_low": row["ci_low"],
         "ci_high": row["ci_high"]},
        {"heads": "random heads (control)", "metric": metric, "delta": row["control_delta"],
         "ci_low": row["control_ci_low"], "ci_high": row["control_ci_high"]},
    ])
    out: dict[str, Any] = {"effects": effects, "sweep": row.to_dict(), "control": row["control"]}
    try:
        tokens = validate_text(model, text)
        clean = token_losses(model, tokens)
        reference = None if method in ("zero", "uniform") else _text_reference(model, metric, prompts, n_prompts, seed)
        with ablate(model, list(heads), method=method, reference=reference, seed=seed):
            ablated = token_losses(model, tokens)
        out.update(tokens=readable_tokens(model, tokens)[1:], clean=clean, ablated=ablated,
                   diff=np.asarray(ablated) - np.asarray(clean))
    except HeadlensError as err:
        out["token_note"] = str(err)
    return out


def _text_reference(model: Any, metric: str, prompts: Sequence[str] | None, n_prompts: int, seed: int) -> Any:
    """Reference prompts for mean/resample on the user's text: full-context stdlib snippets for byte
    models (long enough for any text), else the metric's own probe prompts."""
    from headlens.interventions.metrics import make_task, prompts_task

    if getattr(model.tokenizer, "kind", None) == "byte":
        return prompts_task(model, None, n_prompts, seq_len=model.cfg.n_ctx - 1, seed=seed).tokens
    return make_task(model, metric, prompts, n_prompts, seed).tokens
