"""What a head does to the token it attends to, in plain ``transformers`` (no headlens readout anywhere).

The behaviour check of the vocabulary detectors on a Llama-style model (Llama, Mistral, Qwen2, SmolLM2):
the Hugging Face directory is read again by ``AutoModelForCausalLM`` with eager attention. On BOS + r + r
(``r`` random ordinary tokens), at every position of the second copy, a head's output (a forward pre-hook
on ``o_proj``'s input, times its slice of ``o_proj``, through the final RMSNorm at the position's own
scale, then ``lm_head``) is its direct effect on the logits. Where its largest attention weight after BOS
falls on a token ``x_k``, the check reads the share of reference tokens (a random sample of the
vocabulary) whose direct effect is below that of ``x_k``: near 1 for a head that copies what it attends
to, near 0 for one that suppresses it, about 0.5 for one that does neither.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch


def attended_percentiles(folder: str | Path, pool: torch.Tensor, bos: int, heads: Iterable[tuple[int, int]],
                         n_prompts: int = 8, length: int = 40, n_ref: int = 2048, seed: int = 0
                         ) -> dict[tuple[int, int], float]:
    """``(layer, head) -> median percentile`` of the attended token among the head's direct effects.

    Args:
        folder: the model's Hugging Face directory.
        pool: ``(N,)`` the ordinary token ids the repeated segments are drawn from (without replacement).
        bos: the id every prompt starts with.
        heads: the query heads to check.
    """
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    heads = sorted(set(heads))
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.cat([torch.tensor([bos]), r, r]) for r in
            (pool[torch.randperm(len(pool), generator=gen)[:length]] for _ in range(n_prompts))]
    tokens = torch.stack(rows)  # (B, 1 + 2 * length)
    layers = hf.model.layers
    z: dict[int, torch.Tensor] = {}
    norm = hf.model.norm
    hooks = [layers[i].self_attn.o_proj.register_forward_pre_hook(
        lambda mod, args, i=i: z.__setitem__(i, args[0].detach())) for i in {layer for layer, _ in heads}]
    hooks.append(norm.register_forward_pre_hook(lambda mod, args: z.__setitem__(-1, args[0].detach())))
    try:
        with torch.inference_mode():
            out = hf(tokens, output_attentions=True)
    finally:
        for h in hooks:
            h.remove()
    final = z[-1]  # (B, T, D): the residual entering the final norm
    with torch.inference_mode():
        scale = norm.weight / final.pow(2).mean(-1, keepdim=True).add(norm.variance_epsilon).sqrt()  # (B, T, D)
        W_U = hf.lm_head.weight  # (V, D)
        ref = W_U[torch.randperm(W_U.shape[0], generator=gen)[:n_ref]]  # (n_ref, D)
        q = torch.arange(1 + length, tokens.shape[1])  # the second copy
        H = hf.config.num_attention_heads
        dh = hf.config.hidden_size // H if getattr(hf.config, "head_dim", None) is None else hf.config.head_dim
        result = {}
        for layer, head in heads:
            zh = z[layer][:, q].unflatten(-1, (H, dh))[:, :, head]  # (B, Q, dh)
            W_O = layers[layer].self_attn.o_proj.weight[:, head * dh:(head + 1) * dh]  # (D, dh): out = z W^T
            write = zh @ W_O.T * scale[:, q]  # (B, Q, D): the head's write, normed at the position's scale
            key = out.attentions[layer][:, head, q, 1:].argmax(-1) + 1  # (B, Q): its largest weight after BOS
            at = (write * W_U[tokens.gather(1, key)]).sum(-1, keepdim=True)  # (B, Q, 1): on the attended token
            result[(layer, head)] = float((write @ ref.T < at).float().mean(-1).median())
    return result
