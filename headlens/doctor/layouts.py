"""Find the q/k/v/out projections inside a user's attention module, whatever they are called.

Accepted layouts (searched on the module itself, then on its submodules, first match wins):

* ``nn.MultiheadAttention`` (``batch_first`` either way; ``batch_first=False`` takes ``(T, B, D)``),
  on its own or inside a wrapper module;
* a fused qkv projection ``(3 * d_model, d_model)`` with rows ordered q, k, v, named one of
  ``FUSED_NAMES`` (``c_attn``, ``qkv``, ``in_proj`` ...), plus an output projection;
* separate q, k, v projections named as in ``SEPARATE_NAMES`` (``q_proj/k_proj/v_proj``,
  ``query/key/value``, ``W_q/W_k/W_v`` ...), plus an output projection;
* output projections named one of ``OUT_NAMES`` (``out_proj``, ``c_proj``, ``proj``, ``o_proj`` ...),
  an ``nn.Linear``, a Hugging Face ``Conv1D`` (weight stored ``(in, out)``), or an ``nn.Sequential``
  whose first layer is one of those.

Not accepted (a clear error says so): per-head parameter tensors (TransformerLens' ``W_Q[h]``),
GPT-NeoX's per-head interleaved ``query_key_value``, different key/value widths.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from headlens.errors import HeadlensError

FUSED_NAMES = ("c_attn", "qkv", "qkv_proj", "in_proj", "Wqkv", "W_qkv", "wqkv", "to_qkv", "qkv_linear")
SEPARATE_NAMES = (
    ("q_proj", "k_proj", "v_proj"), ("query", "key", "value"), ("W_q", "W_k", "W_v"), ("W_Q", "W_K", "W_V"),
    ("Wq", "Wk", "Wv"), ("wq", "wk", "wv"), ("q", "k", "v"), ("to_q", "to_k", "to_v"),
    ("q_lin", "k_lin", "v_lin"), ("q_linear", "k_linear", "v_linear"), ("query_proj", "key_proj", "value_proj"),
)
OUT_NAMES = ("out_proj", "c_proj", "o_proj", "proj", "out", "dense", "W_o", "W_O", "Wo", "wo", "to_out",
             "out_lin", "out_linear", "output", "o")


class LayoutError(HeadlensError, TypeError):
    """The doctor cannot find q/k/v/out projections it understands in a module."""

    exit_code = 2


@dataclass
class Proj:
    """One linear projection's weight rows ``[start, stop)`` in ``nn.Linear`` ``(out, in)`` orientation."""

    owner: nn.Module
    weight: str  # attribute name of the weight parameter on owner
    bias: str | None  # attribute name of the bias, None when there is none
    transposed: bool  # weight stored (in, out), as Hugging Face Conv1D does
    start: int = 0
    stop: int | None = None

    def _w(self) -> torch.Tensor:
        w = getattr(self.owner, self.weight)
        return w.T if self.transposed else w

    def get(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        w = self._w()[self.start:self.stop]
        b = getattr(self.owner, self.bias) if self.bias else None
        return w.detach().clone(), (None if b is None else b[self.start:self.stop].detach().clone())

    @torch.no_grad()
    def set(self, w: torch.Tensor, b: torch.Tensor | None) -> None:
        self._w()[self.start:self.stop].copy_(w)
        bias = getattr(self.owner, self.bias) if self.bias else None
        if bias is not None and b is not None:
            bias[self.start:self.stop].copy_(b)


@dataclass
class Layout:
    """Where a module keeps its projections, and how to call it on ``(B, T, D)`` input."""

    kind: str  # "multihead_attention" | "fused" | "separate"
    description: str  # human-readable, for the report
    qkv: list[Proj]  # one fused projection or three separate ones (q, k, v)
    out: Proj
    call: Callable[[nn.Module, torch.Tensor], torch.Tensor]

    def weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(w_qkv (3D, D), b_qkv (3D,), w_o (D, D), b_o (D,))`` with zeros for missing biases."""
        parts = [p.get() for p in self.qkv]
        w_qkv = torch.cat([w for w, _ in parts])
        b_qkv = torch.cat([b if b is not None else torch.zeros(w.shape[0], dtype=w.dtype, device=w.device) for w, b in parts])
        w_o, b_o = self.out.get()
        return w_qkv, b_qkv, w_o, (b_o if b_o is not None else torch.zeros(w_o.shape[0], dtype=w_o.dtype, device=w_o.device))

    def set_weights(self, w_qkv: torch.Tensor, b_qkv: torch.Tensor, w_o: torch.Tensor, b_o: torch.Tensor) -> None:
        rows = 0
        for p in self.qkv:
            n = p.get()[0].shape[0]
            p.set(w_qkv[rows:rows + n], b_qkv[rows:rows + n])
            rows += n
        self.out.set(w_o, b_o)


def _proj_of(m: nn.Module | None, d_in: int, d_out: int) -> Proj | None:
    """A Proj for a Linear / Conv1D / Sequential-starting-with-one mapping d_in -> d_out."""
    if isinstance(m, nn.Sequential) and len(m) > 0:
        m = m[0]
    w = getattr(m, "weight", None) if isinstance(m, nn.Module) else None
    if not isinstance(w, torch.Tensor) or w.ndim != 2:
        return None
    bias = "bias" if isinstance(getattr(m, "bias", None), torch.Tensor) else None
    conv1d = type(m).__name__ == "Conv1D"
    if tuple(w.shape) == (d_out, d_in) and not (conv1d and d_in != d_out):
        return Proj(m, "weight", bias, transposed=conv1d)
    if tuple(w.shape) == (d_in, d_out):
        return Proj(m, "weight", bias, transposed=True)
    return None


def _call_plain(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = module(x)
    return out[0] if isinstance(out, tuple | list) else out


def _mha_caller(causal: bool) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
    def call(mha: nn.Module, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1) if causal else None  # True = hidden
        inp = x if mha.batch_first else x.transpose(0, 1)  # (B, T, D) or (T, B, D)
        out = mha(inp, inp, inp, attn_mask=mask, need_weights=False)[0]
        return out if mha.batch_first else out.transpose(0, 1)  # (B, T, D)

    return call


def _match_mha(m: nn.Module, d: int) -> tuple[list[Proj], Proj] | None:
    if not isinstance(m, nn.MultiheadAttention) or m.embed_dim != d:
        return None
    if not m._qkv_same_embed_dim:
        raise LayoutError("nn.MultiheadAttention with kdim/vdim != embed_dim is not supported by the doctor")
    bias = "in_proj_bias" if m.in_proj_bias is not None else None
    return [Proj(m, "in_proj_weight", bias, False)], _proj_of(m.out_proj, d, d)


def _match_named(m: nn.Module, d: int) -> tuple[str, list[Proj], Proj, str] | None:
    out = next(((n, p) for n in OUT_NAMES if (p := _proj_of(getattr(m, n, None), d, d))), None)
    if out is None:
        return None
    for name in FUSED_NAMES:
        if (p := _proj_of(getattr(m, name, None), d, 3 * d)) is not None:
            return "fused", [p], out[1], f"fused qkv {name!r} + output {out[0]!r}"
    for names in SEPARATE_NAMES:
        projs = [_proj_of(getattr(m, n, None), d, d) for n in names]
        if all(projs) and names[0] != out[0]:
            return "separate", projs, out[1], f"separate {'/'.join(names)} + output {out[0]!r}"
    return None


def find_layout(module: nn.Module, d_model: int, causal: bool) -> Layout:
    """Locate the projections of ``module`` (or of its first submodule that has them).

    Raises:
        LayoutError: no accepted layout found; the message lists what was looked for and found.
    """
    if isinstance(module, nn.MultiheadAttention):
        qkv, out = _match_mha(module, d_model) or ([], None)
        if out is None:
            raise LayoutError(f"nn.MultiheadAttention has embed_dim={module.embed_dim}, expected d_model={d_model}")
        bf = "batch_first=True, (B, T, D)" if module.batch_first else "batch_first=False, (T, B, D)"
        return Layout("multihead_attention", f"nn.MultiheadAttention ({bf}), called with "
                      f"{'a causal' if causal else 'no'} attn_mask", qkv, out, _mha_caller(causal))
    for path, sub in module.named_modules():
        where = f" in submodule {path!r}" if path else ""
        if (mha := _match_mha(sub, d_model)) is not None:
            return Layout("multihead_attention", f"nn.MultiheadAttention{where}", mha[0], mha[1], _call_plain)
        if (named := _match_named(sub, d_model)) is not None:
            kind, qkv, out, desc = named
            return Layout(kind, desc + where, qkv, out, _call_plain)
    children = [f"{n}: {type(c).__name__}" for n, c in module.named_children()][:12]
    raise LayoutError(
        f"cannot find q/k/v/out projections of width d_model={d_model} in {type(module).__name__} "
        f"(children: {children}); expected nn.MultiheadAttention, a fused qkv Linear named one of "
        f"{list(FUSED_NAMES)}, or separate q/k/v Linears named like {['/'.join(n) for n in SEPARATE_NAMES[:4]]}, "
        f"plus an output Linear named one of {list(OUT_NAMES)}"
    )
