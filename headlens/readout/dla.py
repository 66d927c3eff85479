"""Direct logit attribution: how much each head, MLP and the embedding writes directly into a logit.

A component's attribution to a target at a position is its write to the residual stream, passed through
the final norm with the norm's scale frozen at the clean run's value, dotted with ``W_U[:, target]`` (or
with a difference of two columns: a contrast such as ``IO - S``). Why it looks like this:

* **Exact, not approximately so.** The final residual stream is a sum of parts (:mod:`headlens.readout.parts`)
  and, at a frozen scale, every norm between a part and the logits is linear (:mod:`headlens.readout.norms`),
  so the parts plus one ``bias`` term (the output projections' biases, the norms' biases, the unembedding's)
  sum to the model's own logit. Models that norm each sublayer's output again (Gemma 2 / 3
  ``post_attention_layernorm``) get that norm linearised per position the same way and applied to each
  head's share: nothing is left in a remainder. This is a *linearisation* of the write path
  (:mod:`headlens.readout.write`, whose head write under a post-norm moves the norm's scale too): it is what
  makes the shares add up, and it is the one place that freezes the post-norm. Every run measures the gap against the model's logits
  (``attrs["max_error"]``; about 1e-6 in float32) and warns when it is not small.
* **One forward.** Hooks keep only the read positions of each activation (``(B, P, ...)``), so memory
  does not grow with the prompt length; the readout direction is pulled back through the final norm once
  (``g = P(w * u) / scale``) and each head's attribution is ``z_h . (W_O[h] g)``: no per-head residual
  vectors are ever formed. Under grouped-query attention each query head has its own row.
* **Targets.** A token (``target=" Paris"`` or an id), a contrast of two (``contrast=(" Mary", " John")``),
  the IOI metric's logit difference (``metric="logit_diff"``: IO - S at END, per prompt), or by default
  the model's own top prediction at each position. Soft-capped logits (Gemma 2) are decomposed before the
  cap, which is monotone: ``attrs["softcap"]`` says so.

The table (ARCHITECTURE.md, "Attribution table") has one row per component x prompt x position; the
summary with bootstrap CIs over prompts is :func:`headlens.scoring.writers.attribution_summary` (``headlens.attribution_summary``).

>>> import headlens
>>> df = headlens.attribute(headlens.load("smollm2"), "ioi", n_prompts=16)  # doctest: +SKIP
>>> headlens.attribution_summary(df).head(3)  # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from headlens.errors import ProbeError
from headlens.probes.ioi import IOIProbe, resolve
from headlens.probes.text import text_prompts
from headlens.progress import report
from headlens.readout.parts import Parts, ReadoutError, model_parts

COLUMNS = ("model", "component", "prompt", "position", "target", "attribution")
METRICS = ("logit_diff",)  # task metrics that are a difference of two logits (IOI: IO - S at END)
TOKEN_BUDGET = 2048  # prompt rows x positions per forward (the (B, T, V) logits are the largest tensor)
Reads = Callable[[torch.Tensor], dict[str, Callable[[torch.Tensor], None]]]  # a batch's read positions -> its hooks
PROGRESS_BATCH = 16  # the gate's prompts per forward: a few seconds each, so its progress moves (per prompt: no effect)


def attribute(model: Any, prompts: Any, target: str | int | None = None, position: int | str | None = None, *,
              contrast: Sequence[str | int] | str | None = None, metric: str | None = None, n_prompts: int = 128,
              seed: int = 0, batch_size: int | None = None, device: str = "cpu",
              progress: Callable[[int, int], None] | None = None) -> Any:
    """Direct logit attribution of every head, MLP and the embedding: the tidy attribution table.

    Args:
        model: a loaded causal LM or a reference for ``headlens.load``.
        prompts: one text, a list of texts, or ``"ioi"`` / an :class:`~headlens.probes.ioi.IOIProbe`
            (the IOI prompts; ``metric="logit_diff"`` is then the default).
        target: the token whose logit is decomposed (its text, one token, e.g. ``" Paris"``, or its id);
            None with no contrast or metric: the model's top prediction at each position.
        position: where the logits are read: None (each prompt's last token; IOI's ``END``), a token index
            (negative counts from each prompt's end), a named position of the probe (``"S2"``), or
            ``"all"`` (every position of every prompt).
        contrast: two tokens ``(A, B)`` or ``"A,B"``: the attribution to ``logit(A) - logit(B)``.
        metric: ``"logit_diff"``: each IOI prompt's own ``logit(IO) - logit(S)``.
        n_prompts: the size of the IOI probe when ``prompts="ioi"``.
        seed: the seed of the IOI probe.
        batch_size: prompts per forward (default: about 2,048 tokens' worth). Changes speed only.
        device: where a model reference is loaded.
        progress: called as ``progress(prompts done, prompts in all)``.

    Returns:
        A pandas DataFrame with :data:`COLUMNS`: ``component`` is ``embed``, ``L{l}H{h}``, ``mlp{l}`` or
        ``bias``; per prompt and position the attributions sum to the model's logit (or logit difference).
        ``attrs`` hold the provenance and ``max_error``, the largest gap to the model's own logits.
    """
    import pandas as pd

    if isinstance(model, str) or not hasattr(model, "n_heads"):  # a reference or a model object (headlens.load)
        from headlens.models.loading import load

        model = load(model, device=device)
    parts = model_parts(model)
    probe, tokens = _prompts(model, prompts, n_prompts, seed)
    if metric is None and target is None and contrast is None and probe is not None:
        metric = "logit_diff"
    pos = _positions(tokens, position, probe)  # (N, P), -1 where a prompt has fewer positions
    spec = _target_spec(model, target, contrast, metric, probe)
    answers = None if probe is None else probe.answers
    values, ids, worst = _values(model, parts, tokens, pos, spec, answers, batch_size, progress)  # (N, P, C)
    labels = [[_label(model, spec, pair) for pair in row] for row in ids.tolist()]
    names = parts.components
    keep = (pos >= 0).nonzero().tolist()  # (prompt, slot) pairs that exist
    frame = pd.DataFrame({
        "model": str(getattr(model, "name", type(model).__name__)),
        "component": [c for _ in keep for c in names],
        "prompt": [b for b, _ in keep for _ in names],
        "position": [int(pos[b, p]) for b, p in keep for _ in names],
        "target": [labels[b][p] for b, p in keep for _ in names],
        "attribution": values[[b for b, _ in keep], [p for _, p in keep]].reshape(-1).numpy(),
    }, columns=list(COLUMNS))
    _check(worst, model)
    frame.attrs.update(_provenance(model, parts, spec, position, probe, len(tokens), worst))
    return frame


def head_attributions(model: Any, probe: IOIProbe, batch_size: int | None = PROGRESS_BATCH,
                      also: Reads | None = None) -> torch.Tensor:
    """``(P, L, H)`` float64: each query head's direct logit attribution to ``logit(IO) - logit(S)`` at END,
    per prompt of an IOI probe (the name movers' gate, :mod:`headlens.detectors.name_mover`), reported to
    :func:`headlens.progress.report` batch by batch. ``also``: more reads on the same forwards, called with each
    batch's read positions ``(B, 1)`` for ``{hook name: fn(activation)}`` (the negative name movers' attention rows
    at END ride on these forwards instead of forwards of their own)."""
    parts = model_parts(model)
    values, _, worst = _values(model, parts, list(probe.prompts), probe.positions["END"][:, None],
                               {"kind": "metric", "name": "logit_diff"}, probe.answers, batch_size,
                               lambda done, total: report(done, total, "direct logit attribution, prompt by prompt"),
                               also)
    _check(worst, model)
    heads = [i for i, c in enumerate(parts.components) if c.startswith("L")]
    return values[:, 0, heads].reshape(len(probe), parts.n_layers, parts.n_heads)


def _values(model: Any, parts: Parts, tokens: list[torch.Tensor], pos: torch.Tensor, spec: dict,
            answers: torch.Tensor | None, batch_size: int | None, progress: Callable[[int, int], None] | None,
            also: Reads | None = None) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Attributions ``(N, P, C)``, target ids ``(N, P, 2)`` and the largest gap to the logits, batch by batch."""
    N = pos.shape[0]
    per = batch_size or max(1, TOKEN_BUDGET // max(len(t) for t in tokens))
    values, ids, worst = [], [], 0.0
    for start in range(0, N, per):
        rows = range(start, min(N, start + per))
        pair, attr, err = _batch(model, parts, [tokens[i] for i in rows], pos[start:start + per], spec,
                                 None if answers is None else answers[start:start + per], also)
        values.append(attr)
        ids.append(pair)
        worst = max(worst, err)
        if progress is not None:
            progress(rows.stop, N)
    return torch.cat(values), torch.cat(ids), worst


def _prompts(model: Any, prompts: Any, n_prompts: int, seed: int) -> tuple[IOIProbe | None, list[torch.Tensor]]:
    """The IOI probe (or None) and every prompt's token ids, BOS first."""
    if isinstance(prompts, str) and prompts.strip().lower() != "ioi":
        prompts = [prompts]
    probe = resolve(model, prompts, n_prompts, seed)
    if probe is not None:
        return probe, list(probe.prompts)
    if prompts is None or not len(prompts):
        raise ProbeError("attribute needs prompts: a text, a list of texts, or 'ioi'")
    return None, list(text_prompts(model, list(prompts)).prompts)


def _positions(tokens: list[torch.Tensor], position: int | str | None, probe: IOIProbe | None) -> torch.Tensor:
    """``(N, P)`` long token indices read per prompt (``-1`` pads prompts with fewer)."""
    lengths = torch.tensor([len(t) for t in tokens])
    if position is None:
        return (probe.positions["END"] if probe is not None else lengths - 1)[:, None]
    if isinstance(position, str) and position == "all":
        T = int(lengths.max())
        idx = torch.arange(T).expand(len(tokens), T)
        return torch.where(idx < lengths[:, None], idx, -1)
    if isinstance(position, str) and not position.lstrip("-").isdigit():
        names = sorted(probe.positions) if probe is not None else []
        if position not in names:
            raise ProbeError(f"unknown position {position!r}; expected an index, 'all'"
                             + (f" or one of the probe's {', '.join(names)}" if names else ""))
        return probe.positions[position][:, None]
    at = int(position)
    idx = lengths + at if at < 0 else torch.full_like(lengths, at)
    if bool(((idx < 0) | (idx >= lengths)).any()):
        raise ProbeError(f"position {at} is outside a prompt of {int(lengths.min())} tokens")
    return idx[:, None]


def _token_id(model: Any, token: str | int, what: str) -> int:
    if isinstance(token, int):
        tid = int(token)
        if not 0 <= tid < model.cfg.d_vocab:
            raise ProbeError(f"{what} id {tid} is outside the vocabulary (0 .. {model.cfg.d_vocab - 1})")
        return tid
    from headlens.models.vocab import encode_body

    ids = encode_body(model, token)
    if len(ids) != 1:
        pieces = [_text(model, i) for i in ids]
        raise ProbeError(f"{what} {token!r} is {len(ids)} tokens for this tokenizer ({pieces}); give one token "
                         f"(mind the leading space: ' Paris')")
    return ids[0]


def _target_spec(model: Any, target: Any, contrast: Any, metric: str | None, probe: IOIProbe | None) -> dict:
    """What is decomposed: ``{"kind": "metric" | "contrast" | "token" | "prediction", "ids": ...}``."""
    given = [n for n, v in (("target", target), ("contrast", contrast), ("metric", metric)) if v is not None]
    if len(given) > 1:
        raise ProbeError(f"give one of target, contrast and metric, not {' and '.join(given)}")
    if metric is not None:
        if metric not in METRICS:
            raise ProbeError(f"metric {metric!r} is not a logit difference attribute can decompose; expected one "
                             f"of {', '.join(METRICS)}")
        if probe is None:
            raise ProbeError(f"metric {metric!r} reads the IOI prompts' answers; give prompts='ioi' (--prompts ioi)")
        return {"kind": "metric", "name": metric}
    if contrast is not None:
        pair = [p for p in contrast.split(",")] if isinstance(contrast, str) else list(contrast)
        if len(pair) != 2:
            raise ProbeError(f"contrast {contrast!r} needs two tokens, A,B (the attribution to logit A - logit B)")
        return {"kind": "contrast", "ids": (_token_id(model, pair[0], "contrast token"),
                                            _token_id(model, pair[1], "contrast token"))}
    if target is not None:
        return {"kind": "token", "ids": (_token_id(model, target, "target"), -1)}
    return {"kind": "prediction"}


def _batch(model: Any, parts: Parts, tokens: list[torch.Tensor], pos: torch.Tensor, spec: dict,
           answers: torch.Tensor | None, also: Reads | None = None) -> tuple[torch.Tensor, torch.Tensor, float]:
    """One forward: target ids ``(B, P, 2)``, attributions ``(B, P, C)`` float64 and the largest gap to the logits
    (and whatever ``also`` reads on it)."""
    B, P = pos.shape
    T = max(len(t) for t in tokens)
    ids = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, t in enumerate(tokens):
        ids[b, : len(t)], mask[b, : len(t)] = t, 1
    at = pos.clamp(min=0).to(model.device)
    got = read_activations(model, parts, ids.to(model.device), mask.to(model.device), at,
                           reduce=None if also is None else also(at))
    logits = got.pop("logits")  # (B, P, V) at the read positions, before any soft-cap
    if spec["kind"] == "metric":
        pair = answers.to(logits.device)[:, None, :].expand(B, P, 2)
    elif spec["kind"] == "prediction":
        pair = torch.stack([logits.argmax(-1), torch.full((B, P), -1, device=logits.device)], -1)
    else:
        pair = torch.tensor(spec["ids"], device=logits.device).expand(B, P, 2)
    attr = decompose(parts, got, pair)  # (B, P, C)
    total = logits.gather(-1, pair.clamp(min=0)).double()  # (B, P, 2)
    want = total[..., 0] - torch.where(pair[..., 1] >= 0, total[..., 1], 0.0)  # (B, P)
    gap = (attr.sum(-1) - want).abs()[(pos >= 0).to(want.device)]
    return pair.cpu(), attr.cpu(), float(gap.max()) if gap.numel() else 0.0


class _Read(Exception):
    """Raised once the last activation a logit-free read needs has fired: the unembedding is waste."""


def reads(parts: Parts, heads_only: bool = False) -> list[str]:
    """The hooks :func:`decompose` reads (``heads_only``: those :func:`head_columns` reads)."""
    norms = [n for n in (parts.final, *parts.post) if n is not None and n.scale_hook]
    names = [parts.resid, *parts.z, *(n.scale_hook for n in norms)]
    return names if heads_only else [parts.embed, *names, *parts.mlp]


def read_activations(model: Any, parts: Parts, tokens: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor | None,
                     whole: Sequence[str] = (), *, names: Sequence[str] | None = None,
                     reduce: dict[str, Callable[[torch.Tensor], None]] | None = None, logits: bool = True) -> dict:
    """One forward: every activation :func:`decompose` reads, at the read positions ``pos`` ``(B, P)`` only
    (name -> ``(B, P, ...)``; ``"logits"`` ``(B, P, V)``), plus the hooks named in ``whole`` kept whole.

    ``pos=None`` reads every position (the activations themselves, no copy). ``names``: read these hooks
    instead (:func:`reads`). ``reduce``: hook name -> ``fn(x)`` called in the hook, nothing kept (the atlas
    folds each layer's ``(B, H, Q, K)`` pattern there, so no layer's pattern outlives its layer).
    ``logits=False``: the forward stops once every hook has fired, before the ``(B, T, V)`` unembedding.
    """
    rows = torch.arange(tokens.shape[0], device=tokens.device)[:, None]  # (B, 1)
    got: dict[str, torch.Tensor] = {}
    fold = dict(reduce or {})
    names = list(reads(parts) if names is None else names) + list(whole)
    names += [parts.logits] if parts.logits and logits else []
    pending = set(names) | set(fold)

    def keep(name: str) -> Callable[..., None]:
        def hook(x: torch.Tensor, hook: Any) -> None:
            if name in fold:
                fold[name](x.detach())
            if name in names:
                got[name] = x.detach() if pos is None or name in whole else x[rows, pos].detach()  # (B, P, ...)
            pending.discard(name)
            if not logits and not pending:
                raise _Read
        return hook

    try:
        with torch.no_grad(), model.hooks([(n, keep(n)) for n in dict.fromkeys([*names, *fold])]):
            out = model(tokens, attention_mask=mask)
    except _Read:
        return got
    if not logits:
        raise ReadoutError(f"{getattr(model, 'name', 'the model')}: hook {sorted(pending)[0]} never fired in a "
                           f"forward")
    got["logits"] = got.pop(parts.logits) if parts.logits else out if pos is None else out[rows, pos]
    return got


def _direction(parts: Parts, got: dict[str, torch.Tensor], pair: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The readout direction pulled back through the final norm ``g`` ``(B, P, D)`` float64, the direction
    itself ``u`` and the final norm's and unembedding's bias term ``(B, P)``."""
    x = got[parts.resid].double()  # (B, P, D): the final norm's input
    w_u = parts.w_u.to(x.device)
    minus = pair[..., 1] >= 0  # (B, P)
    u = w_u[:, pair[..., 0]].double() - w_u[:, pair[..., 1].clamp(min=0)].double() * minus[None]  # (D, B, P)
    u = u.permute(1, 2, 0)  # (B, P, D): the readout direction in the final norm's output
    final = parts.final
    s = got[final.scale_hook].double() if final.scale_hook else final.scale(x)  # (B, P, 1): frozen from the run
    g = final.pullback(u.to(x), s.to(x))  # (B, P, D): the same direction on the residual stream
    bias = (final.bias.to(x) * u).sum(-1)  # (B, P)
    if parts.b_u is not None:
        b_u = parts.b_u.to(x.device).double()
        bias = bias + b_u[pair[..., 0]] - b_u[pair[..., 1].clamp(min=0)] * minus
    return g, u, bias


def _into_layer(parts: Parts, got: dict[str, torch.Tensor], g: torch.Tensor, layer: int) -> torch.Tensor:
    """``(B, P, D)``: ``g`` pulled back through ``layer``'s post-attention norm (itself where there is none)."""
    post = parts.post[layer]
    return g if post is None else post.pullback(g, got[post.scale_hook].double().to(g))  # into the o_proj


def _heads(parts: Parts, got: dict[str, torch.Tensor], layer: int, g_l: torch.Tensor) -> torch.Tensor:
    """``(B, P, H)`` float64: each query head's attribution in ``layer``, ``z_h . (W_O[h] g_l)``."""
    w_og = torch.einsum("hdD,bpD->bphd", parts.w_o[layer].to(g_l), g_l)  # (B, P, H, d_head): W_O[h] g
    return (got[parts.z[layer]].double() * w_og).sum(-1)  # (B, P, H): one column per query head


def head_columns(parts: Parts, got: dict[str, torch.Tensor], pair: torch.Tensor) -> torch.Tensor:
    """``(B, P, L, H)`` float64: the head columns of :func:`decompose` alone (same arithmetic, same values),
    from the activations :func:`reads` names with ``heads_only``."""
    g = _direction(parts, got, pair)[0]
    return torch.stack([_heads(parts, got, layer, _into_layer(parts, got, g, layer))
                        for layer in range(parts.n_layers)], 2)  # (B, P, L, H)


def decompose(parts: Parts, got: dict[str, torch.Tensor], pair: torch.Tensor) -> torch.Tensor:
    """``(B, P, C)`` float64 attributions (components in ``parts.components`` order, ``bias`` last) of the
    logit of ``pair[..., 0]`` minus that of ``pair[..., 1]`` (none where it is ``-1``), from activations
    ``got`` read at the positions (:func:`read_activations`)."""
    g, _, bias = _direction(parts, got, pair)
    cols = [(got[parts.embed].double() * g).sum(-1, keepdim=True)]  # (B, P, 1)
    for layer in range(parts.n_layers):
        post = parts.post[layer]
        g_l = _into_layer(parts, got, g, layer)  # (B, P, D) into the o_proj
        if post is not None:
            bias = bias + (post.bias.to(g) * g).sum(-1)
        cols.append(_heads(parts, got, layer, g_l))  # (B, P, H)
        if parts.b_o[layer] is not None:
            bias = bias + (parts.b_o[layer].to(g) * g_l).sum(-1)
        if parts.mlp:
            cols.append((got[parts.mlp[layer]].double() * g).sum(-1, keepdim=True))
    return torch.cat([*cols, bias[..., None]], dim=-1)  # (B, P, C)


def _text(model: Any, tid: int) -> str:
    tok = getattr(model, "tokenizer", None)
    if hasattr(tok, "decode") and not hasattr(tok, "alphabet"):
        return tok.decode([tid])
    return model.to_str_tokens(torch.tensor([tid]))[0]


def _label(model: Any, spec: dict, pair: list[int]) -> str:
    if spec["kind"] == "metric":
        return "IO - S"
    first = repr(_text(model, pair[0]))
    return first if pair[1] < 0 else f"{first} - {_text(model, pair[1])!r}"


def _check(worst: float, model: Any) -> None:
    if worst > 1e-3 and str(getattr(model, "dtype", "float32")).endswith("float32"):
        warnings.warn(f"direct logit attribution: the parts of {getattr(model, 'name', 'the model')!r} miss its "
                      f"logits by up to {worst:.2g} (expected ~1e-6 in float32): this architecture's residual "
                      f"stream or norms are not read right; treat the table with care", stacklevel=3)


def _provenance(model: Any, parts: Parts, spec: dict, position: Any, probe: IOIProbe | None, n: int,
                worst: float) -> dict[str, Any]:
    from headlens import __version__

    return {"headlens_version": __version__, "table": "direct logit attribution", "model": getattr(model, "name", ""),
            "target": dict(spec), "position": "default" if position is None else position,
            "probe": "ioi" if probe is not None else "prompts", "n_prompts": n,
            "probe_settings": dict(probe.settings) if probe is not None else {},
            "frozen_norm": "final norm" + (" and post-attention norms" if any(parts.post) else "")
            + ": scale frozen at the clean run's value", "softcap": parts.softcap, "max_error": worst,
            "n_layers": parts.n_layers, "n_heads": parts.n_heads}


__all__ = ["COLUMNS", "ReadoutError", "attribute", "decompose", "head_attributions", "head_columns", "read_activations",
           "reads"]
