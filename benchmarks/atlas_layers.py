"""Where the all-at-once substitution's loss comes from, layer by layer, measured exactly (a study script).

Reads the descriptions a ``benchmarks/atlas.py --describe-only --save FILE`` run pickled and, on the same 8
held-out windows as its substitution test, prints: every described head substituted at once; each layer's
described heads substituted alone; layers ``0..e`` and ``s..29`` substituted together (where the loss builds
up); every described head but one layer's; and for one layer (``--layer``, default 0) each head alone and left
out in turn, the layer substituted only at query positions ``>= k`` or ``< k``, and its heads' write errors ``W_O (A_desc v - A v)``: how much
they add coherently (``|sum|^2`` against the sum of ``|each|^2``) and how much of the summed error is a
per-position bias (its mean over the windows at each position). Every loss is an exact resumed run
(``headlens.atlas.substitute``), not a first-order estimate. Usage::

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/atlas_layers.py FILE [--layer 0]
"""

from __future__ import annotations

import argparse
import pickle

import torch

import headlens
from headlens.atlas.corpus import MAX_HELDOUT, corpus_windows, split
from headlens.atlas.describe import _classes
from headlens.atlas.exemplars import AtlasConfig
from headlens.atlas.rules import candidate_rules
from headlens.atlas.substitute import MAX_ROWS, SUBST_WINDOWS, _mean, _nll, _run, put_back
from headlens.models.token_text import readable_tokens
from headlens.readout.write import write_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("save", help="a pickle benchmarks/atlas.py --save wrote")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--layer", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with open(args.save, "rb") as f:
        described = [d for d in pickle.load(f)["descriptions"] if d.described and d.mixture]
    model = headlens.load(args.model)
    cfg = AtlasConfig(corpus="prose", n_windows=96, seq_len=128, batch_size=8)  # benchmarks/atlas.py's defaults
    held = split(corpus_windows(model, cfg.corpus, cfg.n_windows, cfg.seq_len, cfg.seed).prompts,
                 max_heldout=MAX_HELDOUT)[1]
    classes = _classes(model, readable_tokens(model, torch.arange(int(model.cfg.d_vocab))))
    n = SUBST_WINDOWS  # the substitution test's windows and patterns, as it picks and builds them
    batch, run, clean_logits, patterns = put_back(model, described, held, candidate_rules(), classes, n)
    tokens = batch.tokens.to(model.device)
    T = tokens.shape[1]
    valid = batch.valid
    clean = float(_mean(_nll(clean_logits, batch.tokens, valid).cpu(), valid[:, 1:]).mean())
    del clean_logits

    def losses(copies: list[list[tuple[int, int, torch.Tensor]]]) -> list[float]:
        """Each copy a list of ``(layer, head, pattern)`` put back together: its mean loss."""
        heads: dict[int, list] = {}
        for j, copy in enumerate(copies):
            for la, h, p in copy:
                heads.setdefault(la, []).append((h, j, "pattern", p))
        nll = _run(model, run, tokens, batch, heads, len(copies), min(heads))  # (K, B, T-1)
        return [float(_mean(x, valid[:, 1:]).mean()) for x in nll]

    def layers(sets: list[set[int]]) -> list[float]:
        per = max(1, MAX_ROWS // tokens.numel())  # copies per resumed run, as the substitution test bounds them
        return [x for i in range(0, len(sets), per) for x in losses(
            [[(d.layer, d.head, patterns[(d.layer, d.head)]) for d in described if d.layer in s]
             for s in sets[i:i + per]])]

    pct = lambda x: f"{100 * (x - clean) / clean:+.1f} %"  # noqa: E731
    L = int(model.cfg.n_layers)
    print(f"clean {clean:.4f} on {n} held-out windows; every described head at once {pct(layers([set(range(L))])[0])}")
    print("each layer alone: " + " ".join(f"L{la} {pct(x)}" for la, x in enumerate(layers([{la} for la in range(L)]))))
    ends = [0, 1, 2, 3, *range(5, L - 1, 3)]
    print("layers 0..e: " + " ".join(f"0-{e} {pct(x)}" for e, x in zip(ends, layers([set(range(e + 1)) for e in ends]), strict=True)))
    starts = [1, 2, 3, *range(6, L, 3)]
    print(f"layers s..{L - 1}: " + " ".join(f"{s}-{L - 1} {pct(x)}" for s, x in
                                          zip(starts, layers([set(range(s, L)) for s in starts]), strict=True)))
    print("every described head but one layer's: " + " ".join(
        f"-L{la} {pct(x)}" for la, x in enumerate(layers([set(range(L)) - {la} for la in range(L)]))))
    la = args.layer
    P = {d.head: patterns[(la, d.head)] for d in described if d.layer == la}
    hs = sorted(P)
    res = losses([[(la, g, P[g]) for g in hs if g != h] for h in hs] + [[(la, h, P[h])] for h in hs])
    print(f"layer {la}, each head left out / alone: " + " ".join(
        f"H{h} {pct(res[i])} / {pct(res[len(hs) + i])}" for i, h in enumerate(hs)))
    ks = [2, 4, 8, 16, 32, 64]

    def rows(p: torch.Tensor, lo: int, hi: int) -> torch.Tensor:  # (B, Q, K): only query rows lo..hi-1 put back
        m = torch.zeros(T, dtype=p.dtype)
        m[lo:hi] = 1
        return p * m[None, :, None]

    res = losses([[(la, h, rows(P[h], kk, T)) for h in hs] for kk in ks] + [[(la, h, rows(P[h], 0, kk)) for h in hs]
                                                                           for kk in ks])
    print(f"layer {la} only at query positions >= k / < k: " + " ".join(
        f"k={kk} {pct(res[i])} / {pct(res[len(ks) + i])}" for i, kk in enumerate(ks)))
    _write_errors(model, la, P, tokens, valid)


def _write_errors(model, la: int, P: dict[int, torch.Tensor], tokens: torch.Tensor, valid: torch.Tensor) -> None:
    store: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(x: torch.Tensor, hook) -> None:
            store[name] = x.detach()
        return hook

    with torch.no_grad(), model.hooks([(f"blocks.{la}.attn.hook_v", keep("v")), (f"blocks.{la}.attn.hook_z", keep("z"))]):
        model(tokens)
    v, z = store["v"].float(), store["z"].float()  # (B, T, H_kv, d_head), (B, T, H, d_head)
    group = z.shape[2] // v.shape[2]
    w_o = write_path(model).w_o(la).float()  # (H, d_head, D)
    err, write = [], []
    for h, p in sorted(P.items()):
        real = p.sum(-1, keepdim=True) > 0  # (B, Q, 1): the rows the description predicts
        zs = torch.where(real, p.float() @ v[:, :, h // group], z[:, :, h])  # (B, T, d_head)
        err.append((zs - z[:, :, h]) @ w_o[h])  # (B, T, D)
        write.append(z[:, :, h] @ w_o[h])
    E, W = torch.stack(err), torch.stack(write)  # (H', B, T, D)
    m = valid.float()  # (B, T)
    sq = lambda x: float(((x ** 2).sum(-1) * m).sum())  # noqa: E731
    tot = E.sum(0)  # (B, T, D)
    bias = (tot * m[..., None]).sum(0) / m.sum(0)[:, None].clamp(min=1)  # (T, D): its mean over windows
    print(f"layer {la} write error: |sum|^2 / sum |each|^2 = {sq(tot) / sq(E):.2f} (1 independent, {len(P)} aligned); "
          f"|sum err|^2 / |sum write|^2 = {sq(tot) / sq(W.sum(0)):.3f}; a per-position bias carries "
          f"{sq(bias[None].expand_as(tot)) / sq(tot):.2f} of it; per head |err|^2 / |write|^2: " + " ".join(
              f"H{h} {sq(E[i]) / sq(W[i]):.3f}" for i, h in enumerate(sorted(P))))


if __name__ == "__main__":
    main()
