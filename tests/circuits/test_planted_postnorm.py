"""A planted induction circuit in a tiny post-norm model (OLMo-2 style), where a linear write is visibly wrong.

Layer 0 head 0 is a previous-token head (constant q and k through the q/k biases, so after RoPE the score
depends on the offset alone; ``plant_offset_heads``' construction): its value copies the token's identity
(residual dims ``TOK``) and its output projection writes it, *small*, into dims ``PREV``. The post-attention
norm then scales the layer's output up to RMS ``GAIN``: what the head adds to the stream is the norm's
output, not ``z @ W_O``. Layer 1 head 0 is an induction head: its query reads ``TOK``, its key reads ``PREV``,
both on RoPE's slowest planes (nearly no rotation over a prompt), so a query finds the position whose
previous token is its own token. Every other head, and both MLPs, are zero.

Ablating L0H0 on the path into L1H0's key therefore moves the key's direction entirely (exact write, through
the norm) while the linear rule moves it by ``|z @ W_O| / GAIN`` of it: the rules differ by far more than any
tolerance.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import run_cli
from hf_families import build, load_eager

import headlens
from headlens.circuits.check import CheckError

D, H, D_HEAD, THETA = 128, 2, 64, 1e6
TOK, PREV = slice(0, 32), slice(32, 64)  # residual dims: the token's identity, the previous token's
GAIN = 4.0  # post-attention norm weight: the layer's output comes out at RMS 4 whatever the head's scale
O_SCALE = 8.0  # |z @ W_O| ~ 8 before the norm, ~45 after it: a linear write moves the key ~6x too little


def _plant(model) -> None:
    """Set the weights described in the module docstring (in place)."""
    torch.manual_seed(0)
    half = D_HEAD // 2
    inv_freq = 1.0 / THETA ** (torch.arange(0, D_HEAD, 2).double() / D_HEAD)  # (32,): RoPE's planes
    fast, slow = list(range(8)), list(range(16, 32))  # planes rotating ~1 rad / token; < 1e-3 rad / token
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        emb = torch.randn(model.config.vocab_size, 32)
        model.model.embed_tokens.weight[:, TOK] = emb / emb.norm(dim=1, keepdim=True)  # unit token vectors
        model.lm_head.weight.normal_(0, 0.02)
        model.model.norm.weight.fill_(1.0)
        for layer in model.model.layers:
            layer.post_attention_layernorm.weight.fill_(GAIN)
            layer.post_feedforward_layernorm.weight.fill_(1.0)
            layer.self_attn.q_norm.weight.fill_(1.0)
            layer.self_attn.k_norm.weight.fill_(1.0)
        a0, a1 = model.model.layers[0].self_attn, model.model.layers[1].self_attn
        # L0H0: previous token. Plane i is dims (i, i + half) of the head (rotate_half).
        for i in fast:
            a0.q_proj.bias[i] = 1.0
            a0.k_proj.bias[i] = math.cos(inv_freq[i])  # the key turned back by one token's angle
            a0.k_proj.bias[i + half] = math.sin(inv_freq[i])
        a0.q_norm.weight[:D_HEAD] = 3.0  # sharpness: score 18 * sum_i cos(theta_i (offset - 1)) / 8
        a0.v_proj.weight[:32, TOK] = torch.eye(32)  # v = the token's identity
        a0.o_proj.weight[PREV, :32] = O_SCALE * torch.eye(32)  # written small into PREV, before the norm
        # L1H0: induction. Query: the token; key: the previous token; on the slow planes only.
        dims = [i for i in slow] + [i + half for i in slow]  # 32 head dims that barely rotate
        a1.q_proj.weight[dims, TOK] = torch.eye(32)
        a1.k_proj.weight[dims, PREV] = torch.eye(32)
        a1.q_norm.weight[:D_HEAD] = 1.0
        a1.k_norm.weight[:D_HEAD] = 1.0  # score 16 * wq * wk * cos(token, previous token): 16 on a match


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    torch.set_num_threads(min(2, torch.get_num_threads()))
    path = build("olmo2", tmp_path_factory.mktemp("planted") / "olmo2_induction", hidden_size=D,
                 num_attention_heads=H, num_key_value_heads=H, attention_bias=True, intermediate_size=64,
                 rope_parameters={"rope_type": "default", "rope_theta": THETA})
    hf = load_eager(path, "olmo2")
    _plant(hf)
    hf.save_pretrained(path)
    model = headlens.load(f"hf:{path}")
    model.path = path
    return model


def _circuit(model, **kw):
    return headlens.circuit(model, receivers="L1H0", inputs="k", metric="receiver:induction", n_prompts=16,
                            n_control=2, n_boot=200, **kw)


def test_the_planted_heads_are_what_they_say(planted):
    scores = headlens.classify(planted, detectors=["previous_token", "induction"], n_prompts=8)
    top = scores.sort_values("score", ascending=False).groupby("detector").head(1).set_index("detector")
    assert (int(top.loc["previous_token", "layer"]), int(top.loc["previous_token", "head"])) == (0, 0)
    assert (int(top.loc["induction", "layer"]), int(top.loc["induction", "head"])) == (1, 0)
    assert top.loc["previous_token", "score"] > 0.9 and top.loc["induction", "score"] > 0.9


def test_the_previous_token_head_comes_first_and_equals_the_reference(planted):
    df = _circuit(planted)
    first = df.sort_values("effect", key=abs, ascending=False).iloc[0]
    assert first.sender == "L0H0" and first.effect < -0.5  # ablating it takes most of the induction score
    check = df.attrs["check"]
    assert check["passed"] and check["edges"][0]["edge"] == "L0H0->L1H0.k"
    np.testing.assert_allclose(check["edges"][0]["effect"], check["edges"][0]["reference"], atol=1e-5)


def test_a_linear_write_path_stops_at_the_run_time_check(planted, monkeypatch):
    from headlens.readout import write

    real = write.write_path
    monkeypatch.setattr("headlens.circuits.senders.write_path",
                        lambda m: write.WritePath(m, (None,) * m.cfg.n_layers, real(m).post_mlp))
    with pytest.raises(CheckError, match=r"run-time check failed: edge L0H0->L1H0.k"):
        _circuit(planted)
    df = _circuit(planted, check=False)  # skipped on request: the linear rule's table, visibly wrong
    assert abs(df.set_index("sender").loc["L0H0", "effect"]) < 0.1


def test_the_cli_says_it_in_one_line_and_exits_10(planted, monkeypatch, capsys):
    from headlens.readout import write

    real = write.write_path
    monkeypatch.setattr("headlens.circuits.senders.write_path",
                        lambda m: write.WritePath(m, (None,) * m.cfg.n_layers, real(m).post_mlp))
    args = ("circuit", "--model", f"hf:{planted.path}", "--receivers", "L1H0", "--inputs", "k", "--metric",
            "receiver:induction", "--n-prompts", "16", "--n-control", "2", "--quiet")
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 11 and "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("headlens: error: run-time check failed")]
    code, out, _ = run_cli(monkeypatch, capsys, *args, "--no-check")
    assert code == 0 and "L0H0" in out
