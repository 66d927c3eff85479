"""Edge attribution patching: the first-order estimate is the derivative of the exact edge patch, and
discovery's first pass patches only the top candidates while reporting every edge exactly."""

from __future__ import annotations

import numpy as np
import pytest

import headlens
from headlens.circuits.api import setup
from headlens.circuits.attribution import edge_attribution, supported
from headlens.circuits.engine import edge_values
from headlens.circuits.nodes import make_edges, parse_nodes
from headlens.testing import PLANTED_EDGES, planted_circuit_model
from tests.conftest import make_gpt, run_cli


class Scaled:
    """Sender deltas times ``k``: the exact patch along the same direction, ``k`` as far."""

    def __init__(self, inner, k):
        self.inner, self.k, self.clean = inner, k, inner.clean

    def delta(self, node):
        return self.inner.delta(node) * self.k


@pytest.mark.parametrize("shape", ["layernorm", "tracr"])
def test_the_estimate_is_the_derivative_of_the_exact_patch(shape):
    """(exact effect of eps * delta) / eps -> the estimate as eps -> 0; at eps = 1e-2 they agree within 2% of
    the largest effect (what is left is float32 rounding of the metric and the second-order term)."""
    from tests.models.test_tracr_shapes import TRACR_LIKE

    kw = dict(n_layers=3, init_range=0.2) if shape == "layernorm" else TRACR_LIKE | {"n_layers": 3, "causal": True}
    model = make_gpt(**kw).double()
    s = setup(model, "repeated_loss", "mean", n_prompts=4, seed=1)
    edges = make_edges(model, parse_nodes("L1H0,L2H1,logits", model), None, "qkv")
    eps = 1e-2
    clean, values = edge_values(model, s.task, ["repeated_loss"], edges, Scaled(s.deltas, eps), fast=False)
    exact = np.array([(values[e, "repeated_loss"] - clean["repeated_loss"]).mean() / eps for e in edges])
    est = edge_attribution(model, s.task, "repeated_loss", edges, s.deltas)
    estimate = np.array([est[e].mean() for e in edges])
    assert np.abs(exact - estimate).max() < 0.02 * np.abs(exact).max()
    assert np.corrcoef(exact, estimate)[0, 1] > 0.999


def test_first_pass_discovery_keeps_the_planted_circuit_and_reports_its_ranking():
    model = planted_circuit_model()
    full = headlens.circuit(model, method="mean", n_prompts=8, n_control=3, seed=1)
    quick = headlens.circuit(model, method="mean", n_prompts=8, n_control=3, seed=1, first_pass=4)
    fp = quick.attrs["first_pass"]
    assert fp["kept"] < fp["candidates"] and "spearman" in fp
    found = set(zip(quick.sender, quick.receiver, quick.input, strict=True))
    assert set(PLANTED_EDGES) <= found <= set(zip(full.sender, full.receiver, full.input, strict=True))
    for row in quick.itertuples():  # what is reported is the exact patch, not the estimate
        same = full[(full.sender == row.sender) & (full.receiver == row.receiver) & (full.input == row.input)]
        assert abs(same.effect.iloc[0] - row.effect) < 1e-9


def test_first_pass_refuses_kl_and_the_cli_reports_its_ranking(monkeypatch, capsys):
    model = make_gpt()
    assert "minimum on the clean run" in supported(model, "kl")
    assert supported(model, "repeated_loss") is None
    code, _, err = run_cli(monkeypatch, capsys, "circuit", "--model", "induction-2l", "--metric", "repeated_loss",
                           "--n-prompts", "8", "--n-control", "2", "--first-pass", "6", "--method", "zero")
    assert code == 0
    assert "first pass: patched" in err and "Spearman" in err


def test_a_first_pass_that_estimates_zero_everywhere_ranks_nothing(monkeypatch):
    import headlens.circuits.attribution as attribution

    monkeypatch.setattr(attribution, "edge_attribution",
                        lambda model, task, metric, edges, deltas, **kw: {e: np.zeros(task.n_prompts) for e in edges})
    df = headlens.circuit(planted_circuit_model(), method="mean", n_prompts=8, n_control=3, seed=1, first_pass=2)
    fp = df.attrs["first_pass"]
    assert fp["kept"] == fp["candidates"] and "every estimate is zero" in fp["skipped"]
    assert set(PLANTED_EDGES) <= set(zip(df.sender, df.receiver, df.input, strict=True))


def _derivative_at_positions(model, fast: bool) -> tuple[np.ndarray, np.ndarray]:
    from tests.circuits.test_positions import _named

    s = setup(model, "repeated_loss", "mean", n_prompts=4, seed=1)
    named = _named(s.task)
    edges = make_edges(model, parse_nodes("L1H1,logits", model), None, "qkv", positions=["A", "C"],
                       sender_positions=["B", "all"])
    eps = 1e-2
    clean, values = edge_values(model, s.task, ["repeated_loss"], edges, Scaled(s.deltas, eps), fast=fast, named=named)
    exact = np.array([(values[e, "repeated_loss"] - clean["repeated_loss"]).mean() / eps for e in edges])
    est = edge_attribution(model, s.task, "repeated_loss", edges, s.deltas, named=named)
    return exact, np.array([est[e].mean() for e in edges])


def test_the_estimate_at_positions_is_the_derivative_of_the_exact_patch_there():
    """Restricted to a receiver's query positions, the gradient flows through its output there only: the
    estimate is still the derivative of the exact patch at those positions (native, float64)."""
    exact, estimate = _derivative_at_positions(make_gpt(n_layers=3, init_range=0.2).double(), fast=False)
    assert np.abs(exact - estimate).max() < 0.02 * np.abs(exact).max()
    assert np.corrcoef(exact, estimate)[0, 1] > 0.999


def test_the_estimate_at_positions_through_the_forks_under_gqa(tmp_path):
    """Through the bridge's forks on a grouped-query Llama: a per-query-head key or value edge at a receiver
    position is ranked by the gradient through that head's own output (not its group's)."""
    from hf_families import build

    model = headlens.load(f"hf:{build('llama', tmp_path / 'llama')}")
    exact, estimate = _derivative_at_positions(model, fast=True)
    assert np.corrcoef(exact, estimate)[0, 1] > 0.99
    assert np.abs(exact - estimate).max() < 0.05 * np.abs(exact).max()


def test_the_bridge_first_pass_in_chunks_of_prompts_equals_one_pass(tmp_path, monkeypatch):
    """Through the bridge, prompts go through the backward pass a few at a time (a pass holds the graph of a
    whole forward): each prompt's estimate is the same as in one pass over all of them, at named positions too."""
    from hf_families import build

    from headlens.circuits import attribution
    from tests.circuits.test_positions import _named

    model = headlens.load(f"hf:{build('llama', tmp_path / 'llama')}")
    s = setup(model, "repeated_loss", "mean", n_prompts=7, seed=1)
    named = _named(s.task)
    edges = make_edges(model, parse_nodes("L1H1,logits", model), None, "qkv", positions=["A", "C"],
                       sender_positions=["B", "all"])
    whole = edge_attribution(model, s.task, "repeated_loss", edges, s.deltas, named=named)
    monkeypatch.setattr(attribution, "CHUNK", 3)  # 3 + 3 + 1 prompts
    chunked = edge_attribution(model, s.task, "repeated_loss", edges, s.deltas, named=named)
    assert all(chunked[e].shape == (7,) for e in edges)
    scale = max(np.abs(v).max() for v in whole.values())
    assert scale > 0 and max(np.abs(chunked[e] - whole[e]).max() for e in edges) < 1e-5 * scale


def _per_edge_reference(model, s, edges) -> dict:
    """The first pass written plainly, one receiver at a time: through the bridge's forks (each head's own copy of
    the residual stream), a zero leaf added to the receiver's copy, the gradient let through the receiver head's
    output at its ``receiver_pos`` only (elsewhere its ``z`` is detached), and per edge the sender's delta at its
    ``sender_pos`` dotted with that gradient, position by position."""
    import torch

    from headlens.circuits.bridge import forks
    from headlens.circuits.nodes import kv_head
    from headlens.interventions.logits import read_columns
    from headlens.interventions.metrics import get_metric, per_prompt_mean
    from headlens.interventions.sweep import task_logits

    L, task = model.cfg.n_layers, s.task
    at = task.at(read_columns(task.positions))
    out = {}
    for e in edges:
        r = e.receiver
        name = (f"blocks.{L - 1}.hook_resid_post" if r.kind == "logits"
                else f"blocks.{r.layer}.attn.hook_{e.input}_input")
        leaf = {}

        def add(x, hook, leaf=leaf):
            leaf["x"] = torch.zeros_like(x, requires_grad=True)
            return x + leaf["x"]

        def through(z, hook, e=e):  # (B, T, H, d_head): only the receiver head at its receiver_pos stays live
            live = torch.zeros((*z.shape[:3], 1), dtype=z.dtype)
            live[:, :, e.receiver.head] = s.named.mask(e.pos)[:, :, None].to(z)
            return z.detach() + (z - z.detach()) * live

        hooks = [(name, add)] + ([] if r.kind == "logits" else [(f"blocks.{r.layer}.attn.hook_z", through)])
        with forks(model), torch.enable_grad(), model.hooks(hooks):
            logits = task_logits(model, task, 0, at.cols)  # (B, C, V)
            total = per_prompt_mean(get_metric(s.metric).value(logits, at, None), at.read()).sum()
            g = torch.autograd.grad(total, leaf["x"])[0]
        if r.kind == "head":  # (B, T, n, D): the receiver's own copy (its key/value head's for k and v)
            g = g[:, :, r.head if e.input == "q" else kv_head(model, r.head)]
        delta = s.deltas.delta(e.sender)  # (B, T, D)
        if e.sender_pos != "all":
            delta = delta * s.named.mask(e.sender_pos)[:, :, None]
        out[e] = (delta * g).sum((1, 2)).detach().double().numpy()  # a post-norm write path keeps its graph
    return out


def test_the_vectorised_first_pass_equals_the_plain_per_edge_one_at_ragged_named_positions(tmp_path, monkeypatch):
    """IOI on a grouped-query Llama, prompts of several templates (END and S2 at different positions): the first
    pass's estimates (every edge of a key at once, only the named rows read, the block's norm pulled back for all
    heads at once, prompts in chunks, each sender's delta made once for every chunk) equal the plain per-edge
    computation to float rounding."""
    from ioi_models import save_ioi_llama

    from headlens.circuits import attribution
    from headlens.circuits.nodes import at_positions

    model = headlens.load(f"hf:{save_ioi_llama(tmp_path / 'ioi')}")
    s = setup(model, "logit_diff", "mean", prompts="ioi", n_prompts=6, seed=0)
    assert len(set(s.named.index["END"].tolist())) > 1
    edges = [p for e in make_edges(model, parse_nodes("L1H1,L1H2", model), None, "qkv")
             for p in at_positions(e, ["END", "S2"], ["S2", "IO", "S1+1", "all"] if e.input != "q" else None)]
    edges += [p for e in make_edges(model, parse_nodes("logits", model), None, ("resid",))
              for p in at_positions(e, ["END"], None)]
    monkeypatch.setattr(attribution, "CHUNK", 4)  # 4 + 2 prompts
    monkeypatch.setattr(attribution, "BLOCK", 64)  # many blocks of keys
    fast = edge_attribution(model, s.task, "logit_diff", edges, s.deltas, named=s.named)
    plain = _per_edge_reference(model, s, edges)
    scale = max(np.abs(v).max() for v in plain.values())
    assert scale > 0 and sum(np.abs(v).max() > 1e-3 * scale for v in plain.values()) > len(edges) // 2
    assert max(np.abs(fast[e] - plain[e]).max() for e in edges) < 1e-5 * scale
    named = [e for e in edges if e.sender_pos != "all"]  # the senders' deltas then made once, kept at those rows
    kept = edge_attribution(model, s.task, "logit_diff", named, s.deltas, named=s.named)
    assert max(np.abs(kept[e] - plain[e]).max() for e in named) < 1e-5 * scale
    # resumed from a recorded run, the blocks run from the first named position to the longest prompt's end
    from headlens.circuits.recorded import CleanRun

    windows, real = [], attribution._window
    monkeypatch.setattr(attribution, "_window", lambda *a: windows.append(w := real(*a)) or w)
    windowed = edge_attribution(model, s.task, "logit_diff", named, s.deltas, named=s.named,
                                record=CleanRun(model, s.task, keys=True))
    assert windows and all(P is not None for _, P in windows) and any(p0 > 0 for p0, _ in windows)
    assert max(np.abs(windowed[e] - plain[e]).max() for e in named) < 1e-5 * scale


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt_neox", "gemma", "qwen3"])
def test_the_first_pass_resumed_from_a_recorded_run_equals_the_plain_per_edge_one(tmp_path, monkeypatch, family):
    """Discovery's first pass starts at the lowest receiver's block from a recorded clean run (the forward below it
    is the recorded one): its estimates equal the plain per-edge computation (whole forwards through the forks),
    on families with a logit soft-cap and post-norms (gemma2), parallel attention and MLP (gpt_neox), one
    key/value head (gemma) and QK norms (qwen3)."""
    from hf_families import build

    from headlens.circuits import attribution
    from headlens.circuits.nodes import at_positions
    from headlens.circuits.recorded import CleanRun
    from tests.circuits.test_positions import _named

    model = headlens.load(f"hf:{build(family, tmp_path / family)}")
    s = setup(model, "repeated_loss", "mean", n_prompts=5, seed=1)
    named = _named(s.task)
    s.named = named
    L = model.cfg.n_layers
    edges = make_edges(model, parse_nodes(f"L{L - 1}H1", model), None, "qkv", positions=["A", "C"],
                       sender_positions=["B", "all"])
    edges += [p for e in make_edges(model, parse_nodes("logits", model), None, ("resid",))
              for p in at_positions(e, ["A"], None)]
    monkeypatch.setattr(attribution, "CHUNK", 3)  # 3 + 2 prompts, each its rows of the recorded run
    record = CleanRun(model, s.task, keys=True)
    resumed = edge_attribution(model, s.task, "repeated_loss", edges, s.deltas, named=named, record=record)
    plain = _per_edge_reference(model, s, edges)
    scale = max(np.abs(v).max() for v in plain.values())
    assert scale > 0 and sum(np.abs(v).max() > 1e-3 * scale for v in plain.values()) > len(edges) // 2
    assert max(np.abs(resumed[e] - plain[e]).max() for e in edges) < 1e-5 * scale
    # every edge at named positions: the blocks run only from the first position one reads (B) on
    windows, real = [], attribution._window
    monkeypatch.setattr(attribution, "_window", lambda *a: windows.append(w := real(*a)) or w)
    named_only = [e for e in edges if e.sender_pos != "all"]
    windowed = edge_attribution(model, s.task, "repeated_loss", named_only, s.deltas, named=named, record=record)
    assert windows and all(p0 > 0 and P is not None for p0, P in windows)
    assert max(np.abs(windowed[e] - plain[e]).max() for e in named_only) < 1e-5 * scale
