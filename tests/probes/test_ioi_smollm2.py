"""SmolLM2 solves IOI: on the probe's prompts IO beats S at END far above chance, measured by the
``logit_diff`` metric and checked against the Hugging Face model run alone (no bridge, no hooks); on the
corrupted (ABC) prompts, where S2 names a third person, the preference for IO collapses (the control)."""

from __future__ import annotations

import torch

from headlens.interventions.metrics import get_metric, ioi_task
from headlens.probes.ioi import ioi_probe


def test_smollm2_solves_ioi(smollm2):
    probe = ioi_probe(smollm2, 32, seed=0)
    assert probe.settings["n_names"] >= 50  # SmolLM2's BPE keeps nearly every name whole
    clean, corrupted = ioi_task(smollm2, probe), ioi_task(smollm2, probe, corrupted=True)
    hf = smollm2.bridge.original_model
    with torch.no_grad():
        ours = get_metric("logit_diff")(smollm2(clean.tokens, attention_mask=clean.attention_mask), clean)
        logits = hf(input_ids=clean.tokens, attention_mask=clean.attention_mask).logits  # (N, T, V)
        bad = hf(input_ids=corrupted.tokens, attention_mask=corrupted.attention_mask).logits
    rows, end = torch.arange(len(probe)), probe.positions["END"]
    pair = logits[rows, end].gather(1, probe.answers)  # (N, 2): IO, S
    truth = pair[:, 0] - pair[:, 1]
    assert torch.allclose(ours.float(), truth, atol=1e-3)
    assert (truth > 0).float().mean() >= 0.85 and truth.mean() > 2.5  # measured: 97 % of 128, 4.2
    pair_bad = bad[rows, end].gather(1, probe.answers)
    assert (pair_bad[:, 0] - pair_bad[:, 1]).mean() < truth.mean() - 2
