"""Sweeps: the cached fast path gives the naive numbers; controls and attribution behave."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import make_gpt

import headlens.interventions.confirm as confirm_mod
from headlens.interventions.ablation import AblationError
from headlens.interventions.controls import control_groups, control_scope
from headlens.interventions.sweep import COLUMNS, sweep

METRICS = ["repeated_loss", "first_half_loss", "kl", "bracket_accuracy"]

torch.set_num_threads(1)  # tiny models: one thread is fastest on a shared 2-core machine


def planted(big_head: tuple[int, int] = (1, 0), scale: float = 20.0):
    """Attention-only model in which only ``big_head`` writes to the residual stream."""
    model = make_gpt(0, attn_only=True, n_ctx=32)
    d = model.cfg.d_head
    with torch.no_grad():
        for layer, block in enumerate(model.transformer.h):
            w = block.attn.c_proj.weight  # (D, H*d_head): column block h is head h
            for h in range(model.n_heads):
                w[:, h * d : (h + 1) * d] *= scale if (layer, h) == big_head else 0.0
    return model


def induction_lm(scale: float = 30.0):
    """headlens.testing's planted model (L0H0 previous-token, L1H0 induction) made to predict:
    L1H0 copies the attended token into an output subspace that the unembedding reads."""
    from headlens.testing import planted_model

    model = planted_model()
    V, n_ctx, D = model.cfg.d_vocab, model.cfg.n_ctx, model.cfg.d_model
    OUT = 2 * V + n_ctx  # after the token, position and previous-token subspaces
    with torch.no_grad():
        for i in range(V):
            model.transformer.h[1].attn.c_attn.weight[2 * D + i, i] = 1.0  # L1H0 v: the attended token
            model.transformer.h[1].attn.c_proj.weight[OUT + i, i] = 1.0  # o: into OUT
            model.lm_head.weight[i, OUT + i] = scale  # unembed: OUT_i -> token i
    return model


@pytest.mark.parametrize("method", ["zero", "mean", "resample", "uniform"])
def test_fast_sweep_equals_naive(method):
    # uniform: a head at init already attends almost uniformly; larger weights give it something to remove
    model = make_gpt(0, n_layers=3, n_heads=4, n_ctx=32, init_range=0.2 if method == "uniform" else 0.02)
    groups = [["L0H1"], ["L2H3"], ["L1H0", "L1H2"], ["L0H2", "L2H1"]]
    kw = dict(groups=groups, method=method, metrics=METRICS, n_prompts=6, n_control=3, n_boot=200, attribution=False)
    fast, naive = sweep(model, fast=True, **kw), sweep(model, fast=False, **kw)
    assert list(fast.columns) == COLUMNS and len(fast) == len(groups) * len(METRICS)
    pd.testing.assert_frame_equal(fast, naive, check_exact=False, rtol=1e-5, atol=1e-6)
    assert fast.loc[fast.metric == "kl", "clean"].abs().max() < 1e-9


def test_every_single_head_by_default_and_progress():
    model = make_gpt(0, n_ctx=32)
    calls = []
    df = sweep(model, n_prompts=4, n_boot=100, progress=lambda d, t: calls.append((d, t)))
    assert df.heads.tolist() == [f"L{layer}H{h}" for layer in range(2) for h in range(4)]
    assert calls[-1] == (8, 8)  # singles' controls are other singles: nothing extra to run


def test_control_groups_match_layers_and_exclude_the_group():
    rng = np.random.default_rng(0)
    group = ((0, 1), (1, 2), (1, 3))
    ctrl = control_groups(group, n_heads=8, n_control=5, rng=rng)
    assert len(ctrl) == len(set(ctrl)) == 5
    for c in ctrl:
        assert sorted(layer for layer, _ in c) == [0, 1, 1]
        assert not set(c) & set(group)
    assert control_groups(((0, 1),), 4, 8, rng) == [((0, 0),), ((0, 2),), ((0, 3),)]  # all, when few
    assert control_groups(((0, 0), (0, 1)), 2, 8, rng) == []  # no other heads left


def test_model_wide_controls_draw_from_every_other_head():
    rng = np.random.default_rng(0)
    layer_1 = tuple((1, h) for h in range(4))  # a whole layer: no same-layer control exists
    assert control_groups(layer_1, 4, 8, rng) == []
    assert control_groups(layer_1, 4, 8, rng, n_layers=2, scope="model") == [tuple((0, h) for h in range(4))]
    ctrl = control_groups(((1, 0), (1, 1)), 4, 6, rng, n_layers=3, scope="model")
    assert len(ctrl) == len(set(ctrl)) == 6 and all(len(c) == 2 and not {(1, 0), (1, 1)} & set(c) for c in ctrl)
    assert {layer for c in ctrl for layer, _ in c} > {1}  # other layers too
    assert control_scope(layer_1, 4, "auto") == "model" and control_scope(((1, 0), (1, 1)), 4, "auto") == "layer"
    assert control_groups(layer_1, 4, 8, rng, n_layers=2, scope="auto") == [tuple((0, h) for h in range(4))]
    df = sweep(make_gpt(0, n_ctx=32), groups=["L1H0", "L1H0,L1H1,L1H2,L1H3"], control="auto", n_prompts=4, n_boot=50)
    assert df.control.tolist() == ["layer", "model"] and df.control_delta.notna().all()
    with pytest.raises(AblationError, match="control must be one of layer, model, auto"):
        sweep(make_gpt(0, n_ctx=32), groups=["L0H0"], control="nearby", n_prompts=4)


def test_planted_head_is_the_only_effect():
    model = planted()
    df = sweep(model, metrics=["repeated_loss", "kl"], n_prompts=6, n_boot=200)
    big = df.heads == "L1H0"
    assert (df.loc[~big, "delta"].abs() < 1e-8).all() and (df.loc[~big, "attribution"].fillna(0).abs() < 1e-8).all()
    kl = df[big & (df.metric == "kl")].iloc[0]
    assert kl.delta > 1e-3 and abs(kl.control_delta) < 1e-8 and kl.beats_control
    assert (df.loc[big, "delta"].abs() > 1e-3).all()


def test_attribution_ranks_heads_like_exact_ablation():
    model = make_gpt(0, n_layers=2, n_heads=8, n_ctx=32)
    df = sweep(model, metrics=["repeated_loss", "bracket_accuracy", "kl"], n_prompts=8, n_boot=100)
    rho = df.attrs["attribution_spearman"]
    assert rho["repeated_loss"] > 0.9
    assert np.isnan(rho["kl"])  # first-order KL is identically zero at the clean point
    assert df.loc[df.metric == "repeated_loss", "attribution"].notna().all()


def test_confirm_adds_effects_for_each_types_strongest_heads(monkeypatch):
    model = planted()
    monkeypatch.setitem(confirm_mod.LABEL_METRICS, "induction", "kl")  # KL: any removed write hurts
    table = pd.DataFrame({
        "layer": [1, 1, 0, 0], "head": [0, 1, 2, 2],
        "detector": ["induction", "induction", "previous_token", "first_token"],
        "label": [True, False, False, True], "score": [0.9, 0.8, 0.1, 0.7],
    })
    out = confirm_mod.confirm(model, table, method="zero", n_prompts=6)
    assert list(out.columns) == [*table.columns, *confirm_mod.CONFIRM_COLUMNS]
    assert out.confirmed.tolist() == [True, False, False, False]  # the resting head writes nothing: no effect
    assert out.ablation_metric.tolist() == ["kl", None, None, "lm_loss"]  # unlabelled rows: not tested
    assert out.ablation_heads.tolist() == ["L1H0", None, None, "L0H2"]
    assert abs(out.ablation_delta.iloc[3]) < 1e-8 and np.isnan(out.ablation_delta.iloc[1:3]).all()
    types = {r["detector"]: r for r in out.attrs["confirmation"]}
    assert set(types) == {"induction", "first_token"} and types["induction"]["confirmed"]
    assert types["induction"]["delta"] > 1e-3 and abs(types["induction"]["control_delta"]) < 1e-8


def test_sweep_on_bridge_matches_native(tmp_path):
    from headlens.models import export
    from headlens.models.hf.boot import load_bridge

    native = make_gpt(0, n_ctx=32)
    bridge = load_bridge(export.export_hf(native, tmp_path / "hf"))
    prompts = ["def f(x): return x + 1", "import os, sys", "class A(B): pass"]  # same ids in both tokenizers
    kw = dict(groups=[["L0H1"], ["L1H2", "L0H0"]], method="mean", metrics=["lm_loss", "kl"], prompts=prompts,
              n_control=2, n_boot=100)
    a, b = sweep(native, **kw), sweep(bridge, **kw)
    assert a["model"].iat[0] == native.name and b["model"].iat[0] == bridge.name  # each table names its model
    pd.testing.assert_frame_equal(a.drop(columns="model"), b.drop(columns="model"), check_exact=False, rtol=1e-4,
                                  atol=1e-5)


@pytest.mark.parametrize("method", ["zero", "uniform"])
def test_naive_sweep_in_chunks_of_prompts_equals_one_forward(method, monkeypatch):
    import headlens.interventions.runners as sweep_mod

    forward = sweep_mod.logit_chunks
    model = make_gpt(0, n_ctx=32, init_range=0.2)
    kw = dict(groups=[["L0H1"], ["L1H2", "L0H0"]], method=method, n_prompts=6, n_control=2, n_boot=100, fast=False)
    whole = sweep(model, **kw)
    monkeypatch.setattr(sweep_mod, "PATTERN_BUDGET", 1)  # one prompt per forward
    calls = []
    monkeypatch.setattr(sweep_mod, "logit_chunks",
                        lambda m, task, rows=0, cols=None: calls.append(rows) or forward(m, task, rows, cols))
    chunked = sweep(model, **kw)
    assert calls and set(calls) == {1}
    pd.testing.assert_frame_equal(whole, chunked, check_exact=False, rtol=1e-5, atol=1e-6)


def test_planted_induction_circuit_classic_result():
    model = induction_lm()
    df = sweep(model, groups=[["L1H0"], ["L0H0"], ["L1H2"]], metrics=["repeated_loss", "first_half_loss"],
               n_prompts=12, n_boot=200).set_index(["heads", "metric"])
    rep = df.xs("repeated_loss", level="metric")
    assert df.loc[("L1H0", "repeated_loss"), "clean"] < 0.01  # the circuit predicts the repeat
    for head in ("L1H0", "L0H0"):  # the induction head and the previous-token head feeding it
        assert rep.loc[head, "delta"] > 1.0 and rep.loc[head, "excess_ci_low"] > 1.0 and rep.loc[head, "beats_control"]
        assert df.loc[(head, "first_half_loss"), "delta"] < 0.1  # nothing to copy there: no harm
    assert abs(rep.loc["L1H2", "delta"]) < 1e-9 and not rep.loc["L1H2", "beats_control"]


def test_confirm_on_planted_induction_circuit():
    """The planted circuit's two types are confirmed; a head labelled wrongly is not, alone or as a type's best."""
    model = induction_lm()
    table = pd.DataFrame({"layer": [0, 1, 1], "head": [0, 0, 2], "detector": ["previous_token", "induction", "induction"],
                          "label": [True, True, True], "score": [0.9, 0.9, 0.5]})
    out = confirm_mod.confirm(model, table, n_prompts=12)
    assert out.confirmed.tolist() == [True, True, True]  # L1H2 rides along with L1H0: tested together
    assert out.ablation_heads.tolist() == ["L0H0", "L1H0+L1H2", "L1H0+L1H2"] and (out.ablation_delta > 1.0).all()
    alone = confirm_mod.confirm(model, table, n_prompts=12, top=1)
    assert alone.confirmed.tolist() == [True, True, False] and np.isnan(alone.ablation_delta.iloc[2])
    wrong = confirm_mod.confirm(model, table.assign(label=[False, False, True]), n_prompts=12)
    assert wrong.confirmed.tolist() == [False, False, False] and wrong.ablation_heads.iloc[2] == "L1H2"
    assert wrong.attrs["confirmation"][0]["delta"] < 0.1


def test_confirm_says_untested_where_the_metric_cannot_run():
    table = pd.DataFrame({"layer": [0], "head": [0], "detector": ["induction"], "label": [True], "score": [0.9]})
    out = confirm_mod.confirm(make_gpt(0, causal=False), table, n_prompts=4)  # no next-token loss to measure
    (res,) = out.attrs["confirmation"]
    assert res["error"] and not res["confirmed"] and np.isnan(res["delta"]) and not out.confirmed.any()


def test_confirm_needs_a_classification_table():
    from headlens.errors import HeadlensError

    with pytest.raises(HeadlensError, match="columns"):
        confirm_mod.confirm(make_gpt(0), pd.DataFrame({"layer": [0], "head": [0]}))


@pytest.mark.parametrize("method", ["mean", "uniform"])
def test_fast_sweep_equals_naive_on_tracr_shapes(method):
    """Bidirectional attention, free head width and ReLU (compiled tracr models): the fast path's last block,
    computed at the read positions only, must let every query see every key."""
    from tests.models.test_tracr_shapes import TRACR_LIKE

    model = make_gpt(0, **(TRACR_LIKE | {"n_layers": 3}))
    kw = dict(groups=[["L0H1"], ["L2H2"], ["L1H0", "L2H1"]], method=method, metrics=["kl"], n_prompts=3,
              prompts=["def f(x): pass", "class A: pass ", "import os, sys"], n_control=2, n_boot=100,
              attribution=False)
    fast, naive = sweep(model, fast=True, **kw), sweep(model, fast=False, **kw)
    pd.testing.assert_frame_equal(fast, naive, check_exact=False, rtol=1e-5, atol=1e-6)
    assert fast.delta.abs().max() > 1e-3  # the ablations do something


def test_the_toys_ov_suppression_heads_are_not_confirmed_as_suppressors():
    """induction-2l's layer-1 heads that the weights label ov_suppression, ablated together on the repeat: the
    loss does not fall (+0.01 nats), although the random layer-1 groups, which hit the induction head, cost far
    more; an against-the-task type needs its own effect on the helpful side, not only a large excess."""
    import headlens

    model = headlens.load("induction-2l")
    table = pd.DataFrame({"layer": [1, 1, 1], "head": [0, 2, 3], "detector": ["ov_suppression"] * 3,
                          "label": [True] * 3, "score": [0.9, 1.0, 1.0]})
    (res,) = confirm_mod.confirm(model, table, n_prompts=16).attrs["confirmation"]
    assert res["metric"] == "repeated_loss" and res["ci_low"] > 0 and res["delta"] < 0.05
    assert res["control_delta"] > 1 and not res["confirmed"]
