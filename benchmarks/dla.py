"""Direct logit attribution against TransformerLens' own, side by side, on SmolLM2 and the IOI probe.

1. **Time.** ``headlens.attribute`` on N IOI prompts (default 128; ``logit_diff``: IO - S at END) next to one
   plain forward pass over the same prompts in the same batches (goal: attribute <= 2x the forward), and
   TransformerLens' DLA of the same quantity: a second bridge of the same directory in compatibility mode
   (``enable_compatibility_mode``: the final norm folded into ``W_U``), ``run_with_cache`` of the activations
   it needs, ``cache.stack_head_results(apply_ln=True)`` (every head, at every position; the prompts end at
   different positions, so TL's single ``pos_slice`` cannot pick END) and ``cache.decompose_resid(apply_ln=True)``
   for the MLPs and the embedding, dotted with ``W_U[:, IO] - W_U[:, S]`` and read at each prompt's END.
2. **Equality.** Both define the same quantity on SmolLM2 (a Llama: RMSNorm, no post-attention norm, no
   soft-cap): every head's and every MLP's attribution must agree within 1e-4.

Run: ``python benchmarks/dla.py [--prompts 128] [--repeats 3]``. One thread (``torch.set_num_threads(1)``);
times are CPU seconds of this process, the median of the repeats after a warm-up round, interleaved, so a
shared machine hurts every contender alike. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def batches(task: Any, per: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(task.tokens[i:i + per], task.attention_mask[i:i + per]) for i in range(0, len(task.tokens), per)]


def tl_attribution(tl: Any, task: Any, probe: Any, per: int) -> torch.Tensor:
    """``(N, C)`` TransformerLens' DLA to IO - S at END: heads (L x H), then per layer the MLP."""
    L, H = tl.cfg.n_layers, tl.cfg.n_heads
    keep = ("hook_z", "hook_mlp_out", "ln_final.hook_scale", "hook_embed", "hook_attn_out", "hook_pos_embed")
    rows = []
    for (tokens, mask), start in zip(batches(task, per), range(0, len(task.tokens), per), strict=True):
        end = probe.positions["END"][start:start + len(tokens)]
        answers = probe.answers[start:start + len(tokens)]
        with torch.no_grad():
            _, cache = tl.run_with_cache(tokens, attention_mask=mask, names_filter=lambda n: n.endswith(keep))
            heads = cache.stack_head_results(layer=-1, apply_ln=True)  # (L*H, B, T, D)
            resid, labels = cache.decompose_resid(layer=-1, apply_ln=True, return_labels=True)  # (C', B, T, D)
        u = tl.W_U[:, answers[:, 0]] - tl.W_U[:, answers[:, 1]]  # (D, B)
        b = torch.arange(len(tokens))
        head_attr = torch.einsum("cbd,db->bc", heads[:, b, end], u)  # (B, L*H)
        mlps = [labels.index(f"{layer}_mlp_out") for layer in range(L)]
        mlp_attr = torch.einsum("cbd,db->bc", resid[mlps][:, b, end], u)  # (B, L)
        rows.append(torch.cat([head_attr, mlp_attr], 1))
    assert heads.shape[0] == L * H
    return torch.cat(rows).double()


def ours_matrix(table: Any, L: int, H: int) -> torch.Tensor:
    wide = table.pivot(index="prompt", columns="component", values="attribution")
    cols = [f"L{layer}H{h}" for layer in range(L) for h in range(H)] + [f"mlp{layer}" for layer in range(L)]
    return torch.tensor(wide[cols].to_numpy())


def median_times(fns: dict[str, Any], repeats: int) -> dict[str, float]:
    """Median CPU seconds of each callable (one warm-up round first), interleaved round-robin."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.process_time()
            fn()
            times[name].append(time.process_time() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    from transformer_lens.model_bridge import TransformerBridge

    import headlens
    from headlens.interventions.metrics import ioi_task
    from headlens.probes.ioi import ioi_probe
    from headlens.readout.dla import TOKEN_BUDGET

    model = headlens.load("smollm2")
    probe = ioi_probe(model, args.prompts)
    task = ioi_task(model, probe)
    per = max(1, TOKEN_BUDGET // task.tokens.shape[1])
    tl = TransformerBridge.boot_transformers(model.source["cache"], device="cpu", tokenizer=model.tokenizer)
    tl.enable_compatibility_mode(disable_warnings=True)
    L, H = model.n_layers, model.n_heads
    out: dict[str, Any] = {}

    def forward() -> None:
        with torch.no_grad():
            for tokens, mask in batches(task, per):
                model(tokens, attention_mask=mask)

    fns = {"forward": forward,
           "headlens.attribute": lambda: out.__setitem__("ours", headlens.attribute(model, probe)),
           "TransformerLens": lambda: out.__setitem__("tl", tl_attribution(tl, task, probe, per))}
    times = median_times(fns, args.repeats)
    ours, theirs = ours_matrix(out["ours"], L, H), out["tl"]
    gap = float((ours - theirs).abs().max())
    print(f"SmolLM2, {args.prompts} IOI prompts (logit_diff at END), {per} prompts per forward, "
          f"median of {args.repeats} (CPU s, one thread)")
    for name, t in times.items():
        print(f"  {name:20s} {t:7.2f} s   {t / times['forward']:5.2f}x the forward")
    print(f"  TransformerLens / headlens: {times['TransformerLens'] / times['headlens.attribute']:.2f}x")
    print(f"  equal within 1e-4 (270 heads + 30 MLPs x {args.prompts} prompts): max |diff| {gap:.2e} "
          f"-> {'yes' if gap < 1e-4 else 'NO'}")
    print(f"  headlens' parts vs the model's logit difference: max gap {out['ours'].attrs['max_error']:.1e}")


if __name__ == "__main__":
    main()
