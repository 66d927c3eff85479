"""Edge patching on every family of the architecture matrix, through the bridge's per-head q/k/v forks.

* batched (``fast``) equals one forward per edge within 1e-5 (float32);
* per key/value group under grouped-query attention equals patching the group's ``k_proj``/``v_proj``
  input in plain transformers (Llama, Mistral, Qwen2, Gemma);
* the ``corrupted`` method equals TransformerLens' ``get_act_patch_direct_path`` within 1e-4;
* families without forks refuse q/k/v receivers in one line and still patch the logits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hf_families import build, load_eager

import headlens
from headlens.circuits.api import setup
from headlens.circuits.engine import edge_values
from headlens.circuits.nodes import CircuitError, make_edges, parse_nodes

FORKED = ["gpt2", "gpt_neox", "llama", "mistral", "qwen2", "gemma", "phi3"]
NO_FORKS = ["gptj", "opt"]
GQA = ["llama", "mistral", "qwen2", "gemma"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    torch.set_num_threads(min(2, torch.get_num_threads()))
    root, cache = tmp_path_factory.mktemp("circuit_families"), {}

    def get(family: str) -> tuple[Path, object]:
        if family not in cache:
            path = build(family, root / family)
            cache[family] = (path, headlens.load(f"hf:{path}"))
        return cache[family]

    return get


@pytest.mark.parametrize("family", FORKED)
def test_batched_equals_one_forward_per_edge(built, family):
    _, model = built(family)
    s = setup(model, "repeated_loss", "mean", n_prompts=3, seed=2)
    edges = make_edges(model, parse_nodes("L1H1,L1H2,logits", model), None, "qkv")
    fast = edge_values(model, s.task, ["repeated_loss"], edges, s.deltas, fast=True, max_tokens=2000)
    naive = edge_values(model, s.task, ["repeated_loss"], edges, s.deltas, fast=False)
    assert max(float(np.abs(fast[1][k] - naive[1][k]).max()) for k in naive[1]) < 1e-5
    moved = [e for e in edges if float(np.abs(naive[1][e, "repeated_loss"] - naive[0]["repeated_loss"]).max()) > 1e-4]
    assert len(moved) > len(edges) // 2


@pytest.mark.parametrize("family", NO_FORKS)
def test_families_without_forks_refuse_qkv_and_patch_logits(built, family):
    _, model = built(family)
    with pytest.raises(CircuitError, match="no per-head q/k/v input forks"):
        headlens.circuit(model, receivers="L1H0", n_prompts=2)
    with pytest.raises(CircuitError, match="no per-head q/k/v input forks"):  # discovery too, before its sweep
        headlens.circuit(model, n_prompts=2, metric="kl", prompts=["a b c d", "e f g h"])
    df = headlens.circuit(model, receivers="logits", senders="L0H1,L1H0", n_prompts=3, n_control=2)
    assert list(df.input) == ["resid", "resid"] and df.effect.abs().max() > 0
    from headlens.circuits.attribution import supported  # no forks, no first pass: it says so

    assert "per-head q/k/v input forks" in supported(model, "repeated_loss")


def _hf_group_edge(hf, tokens, layer_s, head_s, layer_r, group, which, d_head):
    """Logits with head ``(layer_s, head_s)`` zero-ablated on the direct path into group ``group``'s
    ``which``_proj of layer ``layer_r``, in plain transformers (eager)."""
    layers = hf.model.layers
    z = {}
    o_proj = layers[layer_s].self_attn.o_proj
    h = o_proj.register_forward_pre_hook(lambda mod, args: z.setdefault("z", args[0].detach()))
    with torch.no_grad():
        out = hf(tokens, output_hidden_states=True)
    h.remove()
    cols = slice(head_s * d_head, (head_s + 1) * d_head)
    delta = -z["z"][..., cols] @ o_proj.weight[:, cols].T  # (B, T, D): zero ablation of the sender's write
    resid = out.hidden_states[layer_r]  # (B, T, D): the receiver layer's input
    attn = layers[layer_r].self_attn
    proj = getattr(attn, f"{which}_proj")
    rows = slice(group * d_head, (group + 1) * d_head)
    patched = proj(layers[layer_r].input_layernorm(resid + delta))  # (B, T, n_kv * d_head)

    def swap(mod, args, output):
        output = output.clone()
        output[..., rows] = patched[..., rows]
        return output

    h = proj.register_forward_hook(swap)
    try:
        with torch.no_grad():
            return hf(tokens).logits
    finally:
        h.remove()


@pytest.mark.parametrize("family", GQA)
def test_per_group_edge_equals_patching_k_proj_v_proj_input_in_transformers(built, family):
    path, model = built(family)
    hf = load_eager(path, family)
    s = setup(model, "repeated_loss", "zero", n_prompts=3, seed=4)
    edges = make_edges(model, parse_nodes("L1H3", model), parse_nodes("L0H1", model), "kv", per_group=True)
    assert all(e.group for e in edges)
    clean, values = edge_values(model, s.task, ["repeated_loss"], edges, s.deltas)
    from headlens.interventions.metrics import get_metric

    metric = get_metric("repeated_loss")
    d_head = model.cfg.d_head
    for e in edges:
        logits = _hf_group_edge(hf, s.task.tokens, 0, 1, 1, e.receiver.head // (4 // model.cfg.n_kv_heads),
                                e.input, d_head)
        ref = metric(logits, s.task).numpy()
        assert np.abs(values[e, "repeated_loss"] - ref).max() < 1e-4, e.name
        assert np.abs(ref - clean["repeated_loss"]).max() > 1e-4  # the edge does something


def test_per_query_head_kv_edges_differ_from_per_group_under_gqa(built):
    _, model = built("llama")
    s = setup(model, "repeated_loss", "zero", n_prompts=3, seed=4)
    per_head = make_edges(model, parse_nodes("L1H0,L1H1", model), parse_nodes("L0H2", model), "k")
    group = make_edges(model, parse_nodes("L1H0", model), parse_nodes("L0H2", model), "k", per_group=True)
    _, v = edge_values(model, s.task, ["repeated_loss"], per_head + group, s.deltas)
    a, b, g = (v[e, "repeated_loss"] for e in (*per_head, *group))
    assert np.abs(a - g).max() > 1e-5 and np.abs(b - g).max() > 1e-5  # one head reading it is not the group


def test_corrupted_method_equals_transformer_lens_direct_path(built):
    from transformer_lens.patching import get_act_patch_direct_path

    _, model = built("gpt2")
    bridge = model.bridge
    s = setup(model, "repeated_loss", "corrupted", n_prompts=3, seed=5)
    from headlens.interventions.metrics import get_metric, make_task

    clean_tl = make_task(model, "repeated_loss", None, 3, 6).tokens  # setup's default corrupted run: TL's "clean"
    metric = get_metric("repeated_loss")
    _, clean_cache = bridge.run_with_cache(clean_tl)
    _, corrupted_cache = bridge.run_with_cache(s.task.tokens)
    for c in "qkv":
        tl = get_act_patch_direct_path(bridge, s.task.tokens, clean_cache, corrupted_cache,
                                       lambda logits: metric(logits, s.task).mean(), 0, 2, c, verbose=False)
        edges = make_edges(model, parse_nodes("L1H0,L1H1,L1H2,L1H3", model), parse_nodes("L0H2", model), c)
        _, values = edge_values(model, s.task, ["repeated_loss"], edges, s.deltas)
        ours = torch.tensor([values[e, "repeated_loss"].mean() for e in edges])
        assert torch.allclose(ours, tl[1].double().cpu(), atol=1e-4), (c, ours, tl[1])


def test_a_bridged_gpt2_runs_on_its_native_twin(built):
    from headlens.circuits.engine import make_patcher
    from headlens.circuits.native import NativePatcher
    from headlens.circuits.twin import native_twin

    _, model = built("gpt2")
    twin = native_twin(model)
    tokens = torch.randint(5, 250, (2, 24))
    with torch.no_grad():
        assert (twin(tokens) - model(tokens)).abs().max() < 1e-5
    s = setup(model, "repeated_loss", "mean", n_prompts=2)
    assert isinstance(make_patcher(model, s.task, fast=True), NativePatcher)
    assert native_twin(built("llama")[1]) is None  # not a GPT-2: the forks path
    from headlens.circuits.attribution import native_of, supported  # the first pass differentiates the twin

    assert supported(model, "repeated_loss") is None and native_of(model) is twin


def test_composition_through_the_bridge_folds_the_norm_like_the_native_model(built, tmp_path):
    """GPT-2 through the bridge scores as its native twin does (LayerNorm's gamma folded into the receiver,
    the sender's write centred); on RMSNorm families the folded scale is what the family computes
    (Llama's weight, Gemma's 1 + weight)."""
    from headlens.circuits.composition import _norm_scale, scores
    from headlens.circuits.twin import native_twin

    model = headlens.load(f"hf:{build('gpt2', tmp_path / 'gpt2')}")  # its own copy: the gammas change below
    twin = native_twin(model)
    with torch.no_grad():  # a gamma far from 1, so folding it is visible
        for b_native, b_bridge in zip(twin.transformer.h, model.bridge.blocks, strict=True):
            g = torch.rand_like(b_native.ln_1.weight) * 2 + 0.2
            b_native.ln_1.weight.copy_(g)
            dict(b_bridge.ln1.named_parameters())["_original_component.weight"].copy_(g)
    edges = make_edges(model, parse_nodes("L1H0,L1H3", model), parse_nodes("L0H0,L0H2", model), "qkv")
    bridged, native = scores(model, edges, n_null=0), scores(twin, edges, n_null=0)
    assert max(abs(bridged[e][0] - native[e][0]) for e in edges) < 1e-6
    for family, offset in (("llama", 0.0), ("gemma", 1.0)):
        path, m = built(family)
        hf = load_eager(path, family)
        want = hf.model.layers[1].input_layernorm.weight.detach().double() + offset
        assert torch.allclose(_norm_scale(m.bridge.blocks[1]), want, atol=1e-5), family


@pytest.mark.parametrize("family", ["gpt_neox", "llama"])
def test_edge_attribution_through_the_forks_is_the_derivative_of_the_exact_patch(built, family):
    """Through the bridge's forks (the family's own norm and rotary embedding inside the gradient), the first
    pass is the derivative of the exact patch: (exact effect of eps * delta) / eps at eps = 1e-2. Under GQA
    the k/v edges are per group, as the forks are."""
    from headlens.circuits.attribution import edge_attribution, supported

    _, model = built(family)
    assert supported(model, "repeated_loss") is None
    s = setup(model, "repeated_loss", "mean", n_prompts=3, seed=1)
    edges = make_edges(model, parse_nodes("L1H0,L1H3,logits", model), None, "qkv", per_group=True)

    class Scaled:
        def __init__(self, inner, k):
            self.inner, self.k, self.clean = inner, k, inner.clean

        def delta(self, node):
            return self.inner.delta(node) * self.k

    eps = 1e-2
    clean, values = edge_values(model, s.task, ["repeated_loss"], edges, Scaled(s.deltas, eps), fast=True)
    exact = np.array([(values[e, "repeated_loss"] - clean["repeated_loss"]).mean() / eps for e in edges])
    est = edge_attribution(model, s.task, "repeated_loss", edges, s.deltas)
    estimate = np.array([est[e].mean() for e in edges])
    assert np.corrcoef(exact, estimate)[0, 1] > 0.99
    assert np.abs(exact - estimate).max() < 0.05 * np.abs(exact).max()
