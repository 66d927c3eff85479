"""SmolLM2 on IOI, checked against the same weights in plain transformers (eager attention, no bridge):

* it solves the task: IO beats S at END far above chance (the logit difference), and on the corrupted (ABC)
  prompts, where S2 names a third person, the preference collapses (the control);
* direct logit attribution of every one of its 270 query heads equals the head's slice of ``o_proj``'s
  input, through the final RMSNorm at its clean scale, dotted with ``W_U[IO] - W_U[S]``; the parts sum to
  the logit difference; the strongest writers are a few late heads with CIs clear of zero;
* the name movers headlens labels attend from END to IO in the eager attention weights and write IO over S
  there; the negative ones attend to a name and write against it (measured on 128 prompts: name movers
  L23H0 L23H1, negative L23H3, which reads S2 and pushes S down, and L24H4, which reads IO).
"""

from __future__ import annotations

import pytest
import torch

import headlens
from headlens.interventions.metrics import ioi_task
from headlens.probes.ioi import ioi_probe

N = 16


@pytest.fixture(scope="module")
def ioi(smollm2):
    """The probe, headlens' numbers, and plain transformers' (clean: per-head writes; corrupted: logits)."""
    probe = ioi_probe(smollm2, N, seed=0)
    clean, corrupted = ioi_task(smollm2, probe), ioi_task(smollm2, probe, corrupted=True)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(smollm2.source["cache"], attn_implementation="eager").eval()
    rows, end = torch.arange(N), probe.positions["END"]
    seen: dict = {}
    hooks = [layer.self_attn.o_proj.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0][rows, end]))
             for i, layer in enumerate(hf.model.layers)]
    hooks.append(hf.model.norm.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0][rows, end])))
    with torch.no_grad():
        run = hf(input_ids=clean.tokens, attention_mask=clean.attention_mask, output_attentions=True)
        logits = run.logits[rows, end]  # (N, V)
        seen["attn"] = torch.stack([a[rows, :, end] for a in run.attentions], 1)  # (N, L, H, T): END rows
        for h in hooks:
            h.remove()
        bad = hf(input_ids=corrupted.tokens, attention_mask=corrupted.attention_mask).logits[rows, end]
    table = headlens.attribute(smollm2, probe)  # headlens' forward: its parts must sum to the logit difference
    return probe, hf, seen, logits, bad, table


def _diff(logits, answers):
    pair = logits.gather(1, answers)  # (N, 2): IO, S
    return pair[:, 0] - pair[:, 1]


def test_smollm2_solves_ioi(smollm2, ioi):
    probe, _, _, logits, bad, _ = ioi
    assert probe.settings["n_names"] >= 50  # SmolLM2's BPE keeps nearly every name whole
    truth = _diff(logits, probe.answers)
    assert (truth > 0).float().mean() >= 0.85 and truth.mean() > 2.5  # measured: 97 % of 128, 4.2
    assert _diff(bad, probe.answers).mean() < truth.mean() - 2


def test_dla_equals_the_heads_writes_in_plain_transformers(ioi):
    probe, hf, seen, logits, _, table = ioi
    cfg, norm = hf.config, hf.model.norm
    d_head = cfg.hidden_size // cfg.num_attention_heads
    x = seen["x"].double()  # (N, D): the final norm's input at END
    scale = (x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon).sqrt()  # (N, 1)
    w_u = hf.lm_head.weight.detach().double()  # (V, D)
    u = (w_u[probe.answers[:, 0]] - w_u[probe.answers[:, 1]]) * norm.weight.detach().double() / scale  # (N, D)
    ours = table.pivot(index="prompt", columns="component", values="attribution")
    H = cfg.num_attention_heads
    for layer, layer_mod in enumerate(hf.model.layers):
        w_o = layer_mod.self_attn.o_proj.weight.detach().double().view(-1, H, d_head)  # (D, H, d_head)
        z = seen[layer].double().view(N, H, d_head)  # (N, H, d_head): each query head's slice of the input
        truth = torch.einsum("nhd,Dhd,nD->nh", z, w_o, u)  # (N, H)
        got = torch.tensor(ours[[f"L{layer}H{h}" for h in range(H)]].to_numpy())  # (N, H)
        assert (got - truth).abs().max() < 1e-3, layer
    sums = torch.tensor(ours.sum(axis=1).to_numpy(), dtype=torch.float64)
    assert torch.allclose(sums, _diff(logits, probe.answers).double(), atol=1e-3)
    s = headlens.attribution_summary(table, n_boot=200)
    heads = s[s["head"] >= 0]
    top = heads.iloc[0]
    assert top.layer >= 20 and top.ci_low > 1.0 and top.share > 0.25  # one late head carries a quarter or more
    assert set(heads.component[:3]) <= set(heads.component[heads.ci_low > 0])


def test_name_movers(smollm2, ioi):
    probe, _, seen, _, _, _ = ioi
    df = headlens.classify(smollm2, detectors=["name_mover", "negative_name_mover"], n_prompts=N, n_boot=200)
    got = {(d, f"L{layer}H{h}") for d, layer, h in df[df.label][["detector", "layer", "head"]].itertuples(index=False)}
    assert {("name_mover", "L23H0"), ("negative_name_mover", "L23H3"), ("negative_name_mover", "L24H4")} <= got
    rows, attn = torch.arange(N), seen["attn"]  # (N, L, H, T) from transformers' eager attention
    io, s2 = attn[rows, :, :, probe.positions["IO"]], attn[rows, :, :, probe.positions["S2"]]  # (N, L, H)
    for det, name in got:
        layer, head = (int(x) for x in name[1:].split("H"))
        if det == "name_mover":  # labelled against the null (a τ tuned on one model did not transfer), not a τ: it reads IO, and more than S2
            uniform = float((1.0 / (probe.positions["END"].float() + 1)).mean())  # END reads END+1 keys
            assert io[:, layer, head].mean() > max(3 * uniform, s2[:, layer, head].mean()), (name, uniform)
    assert s2[:, 23, 3].mean() > 0.4 and io[:, 24, 4].mean() > 0.4  # the two negative ones read S2 and IO
