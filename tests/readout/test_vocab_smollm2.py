"""SmolLM2's vocabulary heads from its weights, checked against what they do on repeated tokens.

Truth is behaviour in plain transformers (``tests/vocab_reference.py``): where a head attends to a token
of a repeated segment, does its direct effect raise that token above the rest of the vocabulary? The
heads labelled ``ov_copying`` must (their median percentile near 1, most of them above the controls), the
``ov_suppression`` heads must push it down (near 0), and the heads of the same layers whose weights copy
nothing must do neither. Sets and
effects with controls, not third decimals (the model is a quantized file).
"""

from __future__ import annotations

import torch
from vocab_reference import attended_percentiles

import headlens
from headlens.models.vocab import vocab


def _heads(df, det: str) -> set[tuple[int, int]]:
    rows = df[(df.detector == det) & df.label]
    return set(zip(rows.layer.astype(int), rows["head"].astype(int), strict=True))


def test_smollm2_copying_and_suppression_heads_do_what_their_weights_say(smollm2):
    df = headlens.classify(smollm2, detectors="ov_copying,ov_suppression,successor")
    copy, supp = _heads(df, "ov_copying"), _heads(df, "ov_suppression")
    assert {(23, 2), (23, 0), (23, 1)} <= copy and 4 <= len(copy) <= 15 and {(23, 3), (24, 4)} <= supp
    assert not copy & supp and not _heads(df, "successor")  # SmolLM2 has no successor head by the rule
    chance = 5 / smollm2.cfg.d_vocab
    for det in ("ov_copying", "ov_suppression"):  # the shuffled null is chance: 5 of 49,152
        lo, hi = df.attrs["weights"][det]["null_score"]["ci"]
        assert lo < 3 * chance and hi > chance / 3, (det, lo, hi)
    cp = df[df.detector == "ov_copying"]
    assert int((cp.eigen >= 0.9).sum()) >= 3 * len(copy)  # the raw eigenvalue rule labelled far more heads
    assert (cp[cp.label].ci_low > cp[cp.label].null).all()

    layers = {layer for layer, _ in copy | supp}
    scores = df.pivot_table(index=["layer", "head"], columns="detector", values="score")
    controls = {h for h in scores.index if h[0] in layers and h not in copy | supp
                and scores.loc[h, "ov_copying"] <= 0.01 and scores.loc[h, "ov_suppression"] <= 0.01}
    assert len(controls) >= 5
    folder = smollm2.source["cache"]
    torch.set_num_threads(min(2, torch.get_num_threads()))
    pct = attended_percentiles(folder, torch.tensor(vocab(smollm2).ordinary), smollm2.bos_token_id,
                               copy | supp | controls, n_prompts=4)
    median = lambda heads: float(torch.tensor([pct[h] for h in heads]).median())  # noqa: E731
    assert median(copy) > 0.9 and median(supp) < 0.1, (median(copy), median(supp))
    assert 0.25 < median(controls) < 0.75, median(controls)
    above = [h for h in copy if pct[h] > median(controls)]  # the weakest copier may act weakly on this text
    assert len(above) >= 0.75 * len(copy) and max(pct[h] for h in supp) < median(controls), pct
