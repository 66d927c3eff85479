"""Edge attribution patching (EAP): a first-order estimate of every edge's effect from one forward and one
backward pass, to rank discovery's candidates before the exact patching that reports them.

For edge ``S -> R.c`` (receiver head ``h`` of layer ``l``, input ``c`` of q/k/v) the exact patch moves the
residual stream that ``R.c`` reads from ``x`` to ``x + delta_S``. To first order the metric changes by

    ``sum_t < delta_S[t], J_LN(x[t])^T W_{c,h}^T g_{c,h}[t] >``,   ``g_{c,h} = dM / d(hook_c)[:, :, h]``

(Syed et al. 2023, "Attribution patching outperforms automated circuit discovery"). ``delta_S`` is the
sender's exact write change (:mod:`headlens.readout.write`: through a post-attention norm where the family
has one, so its Jacobian and more are in it); only the receiver's side is linearised. The gradients of every
head's q, k and v come from one backward pass (zero tensors added at ``hook_q|k|v``, so the model's own
``.grad`` fields are untouched); LayerNorm's transposed Jacobian is applied in closed form,
``J^T w = (gamma w - mean(gamma w) - x_hat mean(gamma w x_hat)) / sigma``. Logits receivers read the final
residual stream: their gradient is the one at the last block's ``hook_resid_post``.

Native models and bridged GPT-2s (through their native twin) by this formula; other Hugging Face families
through the bridge's per-head q/k/v input forks (:func:`_bridge_attribution`). ``kl`` sits at its minimum on the clean
run, so its first-order estimate is zero everywhere: no first pass for it. A metric that is not
differentiable uses the smooth surrogate the head attribution uses (``interventions.metrics.SURROGATES``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from headlens.circuits.nodes import INPUTS, CircuitError, Edge
from headlens.circuits.positions import ALL
from headlens.interventions.logits import logits_at, read_columns
from headlens.interventions.metrics import SURROGATES, Task, get_metric, per_prompt_mean


def native_of(model: Any) -> Any:
    """The native GPT the first pass differentiates: the model itself, a bridged GPT-2's twin, or None."""
    from headlens.circuits.twin import native_twin
    from headlens.models.gpt import GPT

    return model if isinstance(model, GPT) else native_twin(model)


def supported(model: Any, metric: str) -> str | None:
    """None when the first pass can rank edges of ``model`` on ``metric``, else why not (one line)."""
    if get_metric(metric).needs_clean:
        return f"{metric} is at its minimum on the clean run: its first-order estimate is zero"
    if native_of(model) is None:
        from headlens.circuits.bridge import has_forks

        if not (hasattr(model, "bridge") and has_forks(model)):
            return "edge attribution needs a native model or a bridge with per-head q/k/v input forks"
    return None


def _ln_vjp(norm: torch.nn.Module, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``J_norm(x)^T w`` for ``w`` ``(..., B, T, D)`` at ``x`` ``(B, T, D)``: LayerNorm in closed form, Identity as is."""
    if not isinstance(norm, torch.nn.LayerNorm):
        return w
    mu = x.mean(-1, keepdim=True)
    sigma = (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
    x_hat = (x - mu) / sigma  # (B, T, D)
    gw = w * norm.weight  # (..., B, T, D)
    return (gw - gw.mean(-1, keepdim=True) - x_hat * (gw * x_hat).mean(-1, keepdim=True)) / sigma


def edge_attribution(model: Any, task: Task, metric: str, edges: Sequence[Edge], deltas: Any,
                     named: Any = None, record: Any = None, progress: Callable[[int], None] | None = None
                     ) -> dict[Edge, np.ndarray]:
    """Per-prompt first-order estimates ``(B,)`` of each edge's effect (``metric(patched) - metric(clean)``).

    ``named``: the prompts' named positions, for edges restricted to them (:mod:`~headlens.circuits.positions`):
    the sender's delta is masked to ``sender_pos``, and the gradient at the receiver's input is the one that
    flows through its output at ``receiver_pos`` only (:class:`_Restricted`). ``record``: a clean run of ``task``'s
    prompts recorded on the bridge (:class:`~headlens.circuits.recorded.CleanRun`): the forward then starts at the
    lowest receiver's block from its recorded input (nothing below it is differentiated). ``progress(n)``: called
    as each chunk of ``n`` prompts is done (for a progress display; the prompts in all).
    """
    why = supported(model, metric)
    if why is not None:
        raise ValueError(why)
    gpt = native_of(model)
    value = SURROGATES.get(metric, get_metric(metric).value)
    if gpt is None:
        return _in_chunks(model, task, value, edges, deltas, named, record, progress)
    L = gpt.cfg.n_layers
    layers = sorted({e.receiver.layer for e in edges if e.receiver.kind == "head"})
    final = f"blocks.{L - 1}.hook_resid_post"
    run = _Restricted(edges, named)
    seen: dict[str, torch.Tensor] = {}

    def keep(x: torch.Tensor, hook: Any) -> None:
        seen[hook.name] = x.detach()

    fwd = [(f"blocks.{layer}.attn.hook_{c}", run.leaf) for layer in layers for c in INPUTS]
    fwd += [(f"blocks.{layer}.attn.hook_z", run.z) for layer in layers if run.needs(layer)]
    fwd += [(f"blocks.{layer}.hook_resid_pre", keep) for layer in layers] + [(final, run.leaf)]
    at = task.at(read_columns(task.positions))  # the logits (and their gradients) at the read positions only
    with torch.enable_grad(), gpt.hooks(fwd):
        logits = logits_at(gpt, task.tokens, at.cols, task.attention_mask)  # (B, C, V)
        run.backward(per_prompt_mean(value(logits, at, None), at.read()).sum())
        H, d = gpt.cfg.n_heads, gpt.cfg.d_head

        def read(layer: int, c: str, pos: str, b: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            """``(H, R, D)``: what each head's input c reads at rows ``(b, t)``, the gradient through its output at
            ``pos``."""
            block = gpt.transformer.h[layer]
            w = block.attn.c_attn.weight.detach().view(3, H, d, -1)  # (qkv, H, d_head, D): q, k, v rows, heads
            g = run.grad(f"blocks.{layer}.attn.hook_{c}", layer, pos)[b, t]  # (R, H, d_head)
            u = torch.einsum("rhd,hdD->hrD", g, w[INPUTS.index(c)])  # (H, R, D): at the normed input
            return _ln_vjp(block.ln_1, seen[f"blocks.{layer}.hook_resid_pre"][b, t], u)

        def key_of(e: Edge) -> tuple[Any, int]:
            r = e.receiver
            return ("final", 0) if r.kind == "logits" else ((r.layer, e.input, e.pos), r.head)

        def grads_for(key: Any, b: torch.Tensor, t: torch.Tensor) -> torch.Tensor:  # (n, R, D); the logits read
            return run.grads[final][None, b, t] if key == "final" else read(*key, b, t)  # the final stream, via ln_f

        out = run.estimates(edges, deltas, key_of, grads_for)
    if progress is not None:
        progress(task.n_prompts)
    return out


class _Restricted:
    """The gradients one backward pass gives, and those restricted to receivers' query positions.

    An edge patched only at ``receiver_pos`` changes the receiver's output there only, so its first-order
    effect is ``<delta, J^T (g_z * mask)>``: ``g_z`` the metric's gradient at the receiver layer's ``hook_z``
    (everything downstream live), masked to those query positions, pulled back through that one layer to its
    inputs (a vector-Jacobian product on the forward's graph). One per (layer, position name), and under
    grouped-query attention one per query head of a key/value group (a key/value copy feeds its whole group).
    """

    def __init__(self, edges: Sequence[Edge], named: Any) -> None:
        self.named = named
        self.pos_layers = {e.receiver.layer for e in edges if e.receiver.kind == "head" and e.pos != "all"}
        self.leaves: dict[str, torch.Tensor] = {}
        self.zs: dict[int, torch.Tensor] = {}
        self.grads: dict[str, torch.Tensor] = {}
        self._local: dict[tuple[int, str, int | None], dict[str, torch.Tensor]] = {}
        self.p0 = 0  # the forward's first position (its leaves hold positions p0..): see :func:`_window`

    def needs(self, layer: int) -> bool:
        return layer in self.pos_layers

    def leaf(self, x: torch.Tensor, hook: Any) -> torch.Tensor:
        self.leaves[hook.name] = torch.zeros_like(x, requires_grad=True)
        return x + self.leaves[hook.name]

    def z(self, x: torch.Tensor, hook: Any) -> torch.Tensor:  # (B, T, H, d_head)
        self.zs[int(hook.name.split(".")[1])] = x
        return self.leaf(x, hook)

    def backward(self, total: torch.Tensor) -> None:
        names = list(self.leaves)
        self.grads = dict(zip(names, torch.autograd.grad(total, [self.leaves[n] for n in names],
                                                         retain_graph=bool(self.zs)), strict=True))

    def grad(self, name: str, layer: int, pos: str, heads: Any = None) -> torch.Tensor:
        """The gradient at input leaf ``name`` of ``layer``, through the outputs at ``pos`` (of ``heads``)."""
        if pos == "all":
            return self.grads[name]
        key = (layer, pos, None if heads is None else tuple(heads))
        if key not in self._local:
            g_z = self.grads[f"blocks.{layer}.attn.hook_z"]  # (B, T, H, d_head)
            mask = self.named.mask(pos)[:, self.p0:self.p0 + g_z.shape[1], None, None].to(g_z)  # (B, S, 1, 1)
            if heads is not None:
                sel = torch.zeros(g_z.shape[2], dtype=g_z.dtype, device=g_z.device)
                sel[list(heads)] = 1.0
                mask = mask * sel[:, None]  # (B, T, H, 1)
            names = [n for n in self.leaves if n.startswith(f"blocks.{layer}.") and "hook_z" not in n]
            out = torch.autograd.grad(self.zs[layer], [self.leaves[n] for n in names], grad_outputs=g_z * mask,
                                      retain_graph=True, allow_unused=True)
            self._local[key] = {n: (torch.zeros_like(self.leaves[n]) if g is None else g)
                                for n, g in zip(names, out, strict=True)}
        return self._local[key][name]

    def estimates(self, edges: Sequence[Edge], deltas: Any, key_of: Any, grads_for: Any
                  ) -> dict[Edge, np.ndarray]:
        """``(B,)`` per edge: the sender's delta (masked to its ``sender_pos``) dotted with its receiver's gradient.

        Only the rows ``(b, t)`` some edge's sender position covers are read (IOI's named positions: one per prompt
        and name, not every token). ``key_of(edge) -> (key, index into n)``; ``grads_for(key, b, t) -> (n, R, D)``,
        the receivers' gradients at those rows, one key at a time. Every sender's delta is gathered once into
        ``(R, S, D)``; per block of keys one batched product dots it with every receiver head's gradient, row by row,
        and one more sums the rows of each sender position per prompt, from which each edge picks its own.
        """
        if not edges:
            return {}
        keyed = [key_of(e) for e in edges]
        by_key: dict[Any, dict[int, list[int]]] = {}  # key -> head index -> the edges' indices
        for j, (key, i) in enumerate(keyed):
            by_key.setdefault(key, {}).setdefault(i, []).append(j)
        senders = list(dict.fromkeys(e.sender for e in edges))
        names = list(dict.fromkeys(e.sender_pos for e in edges))
        first = deltas.delta(senders[0])  # (B, T, D)
        masks = torch.stack([self._mask(n, first) for n in names])  # (P, B, T): one per sender position
        b, t = masks.any(0).nonzero(as_tuple=True)  # (R,) each: the rows any sender position reads
        made = first.new_empty(len(b), len(senders), first.shape[-1])  # (R, S, D): every sender's delta there
        for i, node in enumerate(senders):
            made[:, i] = (first if i == 0 else deltas.delta(node))[b, t]
        del first
        # (R, P, B): row r's weight in prompt b's sum at sender position p (its mask, and 1 for its own prompt)
        weights = masks[:, b, t].T[:, :, None] & (b[:, None] == torch.arange(masks.shape[1], device=b.device))[:, None]
        row = {node: i for i, node in enumerate(senders)}
        col = {n: p for p, n in enumerate(names)}
        picks = [(col[e.sender_pos] * len(senders) + row[e.sender]) for e in edges]  # into (P, S)
        out: list[np.ndarray] = [np.empty(0)] * len(edges)
        block: list[Any] = []
        for n, key in enumerate(by_key):
            block.append(key)
            if n + 1 < len(by_key) and sum(map(len, (by_key[k] for k in block))) * len(b) * len(senders) < BLOCK:
                continue
            grads = torch.cat([grads_for(k, b, t)[sorted(by_key[k])].to(made) for k in block])  # (N, R, D)
            dots = torch.bmm(made, grads.permute(1, 2, 0))  # (R, S, N): per row, every sender . every receiver head
            est = torch.einsum("rpb,rx->bpx", weights.to(made), dots.view(len(b), -1))  # (B, P, S*N)
            est = est.reshape(est.shape[0], -1, grads.shape[0])  # (B, P*S, N)
            idx, where = [], []
            for c, mine in enumerate(by_key[k][i] for k in block for i in sorted(by_key[k])):
                idx += [(picks[j], c) for j in mine]
                where += mine
            ps, cs = torch.tensor(idx, device=est.device).T
            got = est[:, ps, cs].T.detach().double().cpu().numpy()  # (edges of the block, B)
            for j, v in zip(where, got, strict=True):
                out[j] = v
            block = []
        return dict(zip(edges, out, strict=True))

    def _mask(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` bool: sender position ``name`` (``all``: every position)."""
        if name == ALL:
            return torch.ones(like.shape[:2], dtype=torch.bool, device=like.device)
        if self.named is None:
            raise CircuitError(f"an edge is restricted to sender position {name!r}, but the prompts name none")
        return self.named.mask(name)


BLOCK = 2**22  # rows x senders x receiver heads of the dots of one block of keys (16 MB in float32)
CHUNK = 8  # prompts per backward pass through the bridge: a pass holds the autograd graph of a whole forward


def _in_chunks(model: Any, task: Task, value: Any, edges: Sequence[Edge], deltas: Any, named: Any,
               record: Any = None, progress: Callable[[int], None] | None = None) -> dict[Edge, np.ndarray]:
    """:func:`_bridge_attribution` over :data:`CHUNK` prompts at a time, joined: each prompt's estimate depends on
    its own forward only, so the chunks give the same ``(B,)`` per edge, with a graph a quarter the size on 32
    prompts (SmolLM2's IOI discovery peaked at 2.2x a classify of the same prompts in one pass)."""
    B = task.n_prompts
    if B <= CHUNK:
        out = _bridge_attribution(model, task, value, edges, deltas, named, record)
        if progress is not None:
            progress(B)
        return out
    names = {e.sender_pos for e in edges}
    kept = None if named is None or ALL in names else _Kept(deltas, torch.stack([named.mask(n) for n in names]).any(0))
    parts = []
    for i in range(0, B, CHUNK):
        rows = slice(i, min(i + CHUNK, B))
        part = dataclasses.replace(task, **{f: getattr(task, f)[rows] for f in ("tokens", "positions",
                                                                              "attention_mask", "answers")
                                            if getattr(task, f) is not None})
        sub = None if named is None else dataclasses.replace(
            named, index={k: v[rows] for k, v in named.index.items()}, shape=(part.n_prompts, named.shape[1]))
        parts.append(_bridge_attribution(model, part, value, edges, _Rows(deltas, rows) if kept is None
                                         else kept.rows(rows), sub,
                                         None if record is None else record.rows(torch.arange(rows.start, rows.stop))))
        if progress is not None:
            progress(rows.stop - rows.start)
    joined = np.concatenate([np.stack([p[e] for e in edges]) for p in parts], axis=1)  # (E, B): chunks side by side
    return dict(zip(edges, joined, strict=True))


class _Rows:
    """The senders' deltas of some prompts only (``deltas.delta(node)[rows]``)."""

    def __init__(self, deltas: Any, rows: slice) -> None:
        self.deltas, self.rows = deltas, rows

    def delta(self, node: Any) -> torch.Tensor:
        # a copy, not a view: the first pass keeps every sender's delta of a chunk, and a view of 8 rows would
        # hold all 32 prompts' (a third of a GB over SmolLM2's IOI senders)
        return self.deltas.delta(node)[self.rows].clone()  # (b, T, D)


class _Kept:
    """Every sender's delta over all prompts, computed once for every chunk, kept at ``mask`` ``(B, T)`` only (the
    positions the edges' sender positions read; their estimates read nothing else): zero elsewhere."""

    def __init__(self, deltas: Any, mask: torch.Tensor) -> None:
        self.deltas, self.mask = deltas, mask
        self.made: dict[Any, torch.Tensor] = {}  # sender -> (R, D): its delta at the kept positions, row-major

    def rows(self, rows: slice) -> Any:
        """The deltas of prompts ``rows`` (an object with ``delta(node) -> (b, T, D)``)."""
        start = int(self.mask[: rows.start].sum())
        return _KeptRows(self, rows, slice(start, start + int(self.mask[rows].sum())))

    def delta(self, node: Any) -> torch.Tensor:  # (R, D)
        if node not in self.made:
            self.made[node] = self.deltas.delta(node)[self.mask]
        return self.made[node]


class _KeptRows:
    def __init__(self, kept: _Kept, rows: slice, at: slice) -> None:
        self.kept, self.rows, self.at = kept, rows, at

    def delta(self, node: Any) -> torch.Tensor:
        made = self.kept.delta(node)[self.at]  # (r, D): this chunk's kept positions, row-major like the mask
        mask = self.kept.mask[self.rows]  # (b, T)
        out = made.new_zeros(*mask.shape, made.shape[-1])  # (b, T, D)
        out[mask] = made
        return out


def _bridge_attribution(model: Any, task: Task, value: Any, edges: Sequence[Edge], deltas: Any,
                        named: Any = None, record: Any = None) -> dict[Edge, np.ndarray]:
    """The same estimate through the bridge's own forward (no per-head forks, so no normed copy of the residual
    stream per head in the graph): the gradient at each receiver layer's ``hook_q|k|v`` ``(B, T, n, d_head)``
    (before the rotary embedding and any q/k norm: theirs is inside it), through the head's rows of
    ``W_Q|W_K|W_V``, and by autograd on the block's own input norm at the clean residual stream back to what
    the input reads. Under grouped-query attention a key/value head feeds its group: an unrestricted
    per-query-head k/v edge is ranked by its group's estimate; one restricted to a receiver position by the
    gradient through that head's own output."""
    from headlens.circuits.nodes import kv_head, n_kv_heads
    from headlens.circuits.recorded import resumed_logits
    from headlens.interventions.sweep import task_logits

    L = model.cfg.n_layers
    layers = sorted({e.receiver.layer for e in edges if e.receiver.kind == "head"})
    final = f"blocks.{L - 1}.hook_resid_post"
    run = _Restricted(edges, named)
    size = model.cfg.n_heads // n_kv_heads(model)
    seen: dict[str, torch.Tensor] = {}

    def keep(x: torch.Tensor, hook: Any) -> None:
        seen[hook.name] = x.detach()

    fwd = [(f"blocks.{layer}.attn.hook_{c}", run.leaf) for layer in layers for c in INPUTS] + [(final, run.leaf)]
    fwd += [(f"blocks.{layer}.attn.hook_z", run.z) for layer in layers if run.needs(layer)]
    fwd += [(f"blocks.{layer}.hook_resid_pre", keep) for layer in layers]
    def read(layer: int, c: str, pos: str, heads: Any, b: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``(n, R, D)``: per head (per key/value head for k, v) the gradient at what its input c reads, at rows
        ``(b, t)``. The block's own norm, whatever the family's, by autograd: it acts on each position alone, so
        one pass over the rows repeated once per head pulls every head's gradient back at once."""
        block = model.bridge.blocks[layer]
        g = run.grad(f"blocks.{layer}.attn.hook_{c}", layer, pos, heads)[b, t - p0]  # (R, n, d_head)
        w = getattr(block.attn, f"W_{c.upper()}").detach()  # (n, D, d_head)
        u = torch.einsum("rnd,nDd->nrD", g, w.to(g))  # (n, R, D): at the normed input
        if not hasattr(block, "ln1"):  # OLMo-2: no norm before attention
            return u
        x = seen[f"blocks.{layer}.hook_resid_pre"][b, t - p0].expand(len(u), -1, -1).clone().requires_grad_(True)
        return torch.autograd.grad(block.ln1(x), x, u)[0]  # (n, R, D): x is (n, R, D), one "prompt" per head

    at = task.at(read_columns(task.positions))  # the logits (and their gradients) at the read positions only
    p0, P = _window(task, edges, named, at.cols, record)
    run.p0 = p0
    with torch.enable_grad(), model.hooks(fwd):
        if record is None:
            logits = task_logits(model, task, 0, at.cols)  # (B, C, V)
        else:  # from the lowest receiver's block on (the last block's output is the logits receivers' leaf)
            logits = resumed_logits(model, record, min([*layers, L - 1]), at.cols - p0, P)  # (B, C, V)
        run.backward(per_prompt_mean(value(logits, at, None), at.read()).sum())

        def key_of(e: Edge) -> tuple[Any, int]:
            r = e.receiver
            if r.kind == "logits":
                return "final", 0
            idx = r.head if e.input == "q" else kv_head(model, r.head)
            j = r.head % size
            heads = None if (e.input == "q" or e.group or size == 1 or e.pos == "all") else tuple(
                range(j, model.cfg.n_heads, size))
            return (r.layer, e.input, e.pos, heads), idx

        def grads_for(key: Any, b: torch.Tensor, t: torch.Tensor) -> torch.Tensor:  # (n, R, D)
            return run.grads[final][None, b, t - p0] if key == "final" else read(*key, b, t)

        return run.estimates(edges, deltas, key_of, grads_for)


def _window(task: Task, edges: Sequence[Edge], named: Any, cols: torch.Tensor | None,
            record: Any) -> tuple[int, torch.Tensor | None]:
    """``(p0, P)``: the positions a resumed first pass differentiates, ``P`` ``(B, S)`` = ``p0 .. p1 - 1`` for every
    prompt, from the first position any edge reads or patches (nothing before it changes what comes after: the
    model is causal) to the longest prompt's end (past it, padding); ``(0, None)``: all of them."""
    B, T = task.tokens.shape
    names = {e.sender_pos for e in edges} | {e.pos for e in edges if e.receiver.kind == "head"}
    if (record is None or named is None or cols is None or not names <= set(named.index)
            or any(kv is None for kv in record.kv)):
        return 0, None
    idx = torch.cat([named.index[n] for n in names])  # -1: a prompt without that position
    p0 = int(idx[idx >= 0].min()) if bool((idx >= 0).any()) else 0
    p1 = T if task.attention_mask is None else int(task.attention_mask.sum(1).max())
    if p0 > int(cols.min()) or int(cols.max()) >= p1 or (p0 == 0 and p1 == T):
        return 0, None
    return p0, torch.arange(p0, p1, device=task.tokens.device).expand(B, p1 - p0)
