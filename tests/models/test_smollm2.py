"""SmolLM2-135M-Instruct, the real LM of the ``smollm2`` fixture (loaded once per test run).

The heads its card and ``headlens models`` name (:data:`headlens.zoo.real.SMOLLM2`) are checked against
an independent computation in plain transformers: the cached float32 weights booted by
``AutoModelForCausalLM`` with eager attention, ``output_attentions=True``, on probes built here of the same
kind as headlens' (``[<|endoftext|>] + r + r`` with ``r`` random ordinary tokens without replacement).
Assertions are on sets of heads with a control (most heads score near zero), not on decimals: the file
is quantized and a new transformers may move a score slightly.
"""

from __future__ import annotations

import gc

import torch

from headlens.zoo.real import SMOLLM2

EOT = 0  # <|endoftext|>, SmolLM2's document separator: what its prompts start with (headlens.models.hf.prefix)
N_PROMPTS, SEG = 12, 31  # 12 prompts of 63 tokens


def independent_scores(folder: str) -> dict[str, dict[str, float]]:
    """Per detector, ``{"L{l}H{h}": score}`` from transformers' own eager attention on ``[EOT] + r + r``."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    gen = torch.Generator().manual_seed(1234)
    pool = torch.arange(1000, 40000)  # ordinary subword tokens (ids below 17 are specials)
    r = torch.stack([pool[torch.randperm(len(pool), generator=gen)[:SEG]] for _ in range(N_PROMPTS)])
    tokens = torch.cat([torch.full((N_PROMPTS, 1), EOT), r, r], dim=1)  # (N, 2 SEG + 1)
    with torch.inference_mode():
        att = torch.stack(hf(tokens, output_attentions=True).attentions)  # (L, N, H, T, T)
    del hf
    gc.collect()
    second = torch.arange(SEG + 1, 2 * SEG + 1)  # query rows in the copy: r[i] at 1 + SEG + i
    first = torch.arange(1, SEG + 1)  # rows in the first half: random tokens, nothing repeated yet
    per_head = {
        "induction": att[:, :, :, second, second - SEG + 1].mean(dim=(1, 3)),  # the token after r[i]'s first copy
        "duplicate_token": att[:, :, :, second, second - SEG].mean(dim=(1, 3)),  # r[i]'s first copy
        "previous_token": att[:, :, :, first, first - 1].mean(dim=(1, 3)),
    }
    n_heads = att.shape[2]
    return {det: {f"L{i // n_heads}H{i % n_heads}": float(v) for i, v in enumerate(s.flatten())}
            for det, s in per_head.items()}


def test_the_known_heads_are_what_plain_transformers_measures(smollm2):
    scores = independent_scores(smollm2.source["cache"])
    for detector, known in SMOLLM2.known_heads.items():
        ranked = sorted(scores[detector], key=scores[detector].get, reverse=True)
        assert ranked[0] == known[0], (detector, ranked[:5])  # the strongest is the strongest
        assert set(known) <= set(ranked[: len(known) + 1]), (detector, ranked[: len(known) + 2])
        assert min(scores[detector][h] for h in known) >= 0.4, detector  # each would pass the label bar
        median = sorted(scores[detector].values())[len(ranked) // 2]
        assert median < 0.1, (detector, median)  # the control: a typical head does not do this


def test_prompts_start_with_the_document_separator_and_both_lines_say_what_runs(smollm2):
    assert smollm2.bos_token_id == EOT and smollm2.prefix.declared_bos == "<|im_start|>"
    assert smollm2.to_tokens("The Eiffel Tower")[0, 0] == EOT
    dequantized, bos = smollm2.substitutions
    assert dequantized.startswith("'smollm2': dequantized from Q4_1") and "<|endoftext|>" in bos
    assert smollm2.source["quantization"] == "Q4_1" and len(smollm2.source["sha256"]) == 64


def test_the_bracket_probe_finds_brackets_in_subword_text(smollm2):
    """A BPE vocabulary spells a bracket after a space as a token of its own ('Ġ('): still a bracket."""
    from headlens.probes.generated import brackets

    probe = brackets(smollm2, 4, 64, torch.Generator().manual_seed(0))
    strings = smollm2.to_str_tokens(probe.prompts[0])
    pairs = [(k, q) for q, k in enumerate(probe.annotations["bracket_match"][0].tolist()) if k >= 0]
    assert len(pairs) >= 5
    for k, q in pairs:
        assert strings[k].lstrip("Ġ") + strings[q].lstrip("Ġ") in ("()", "[]", "{}", "<>"), (strings[k], strings[q])


def test_a_real_lm_reads_prose_where_a_probe_needs_natural_text(smollm2):
    """The needle's haystack and the text metrics default to English prose on a vocabulary of words; a byte-level
    model (the zoo's, trained on random haystacks) keeps random tokens."""
    from headlens.probes.haystack import default_haystack, needle_haystack
    from headlens.testing import planted_model

    probe = needle_haystack(smollm2, 2, 96, torch.Generator().manual_seed(0))
    assert probe.settings["haystack"] == "prose" and default_haystack(planted_model()) == "random"
    words = smollm2.to_str_tokens(probe.prompts[0])
    assert sum(w.startswith("Ġ") and w[1:].isalpha() for w in words) > len(words) // 3  # words, not noise
