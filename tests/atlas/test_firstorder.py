"""The substitution test to first order: the estimates equal the model's own loss change for small changes
(a forward patched at ``hook_pattern`` / ``hook_z``, written without the estimate's code); the heads run
exactly are the sample it says, the rest are labelled estimated everywhere; ``subst="exact"`` runs them all."""

from __future__ import annotations

import pytest
import torch

from headlens.atlas.build import build_atlas
from headlens.atlas.exemplars import AtlasConfig
from headlens.atlas.firstorder import first_order
from headlens.atlas.rules import candidate_rules
from headlens.atlas.substitute import _loss, substitute
from headlens.errors import ConfigError
from headlens.interventions.ablation import Replacement
from tests.atlas.planted import planted_gpt, repeat_windows

EPS = 0.02  # the size of the change (a quarter of it on z): the second-order remainder is a few % of the first


@pytest.fixture(scope="module")
def mixed():
    model = planted_gpt(mixture=True)
    windows = repeat_windows(model, 32)
    return model, windows, build_atlas(model, AtlasConfig(k=3, batch_size=8), windows=windows, subst_windows=0)


def _forward(model, tokens, pattern=None, z=None):
    """``(B,)`` each window's loss, the model's own forward with ``pattern[(layer, head)]`` ``(B, Q, K)`` put in
    at ``hook_pattern`` and ``z[(layer, head)]`` ``(B, T, d_head)`` at ``hook_z``."""
    pattern, z = pattern or {}, z or {}
    L = model.cfg.n_layers

    def at_pattern(layer):
        def hook(p, hook):  # (B, H, Q, K)
            p = p.clone()
            for (la, h), new in pattern.items():
                if la == layer:
                    p[:, h] = new
            return p
        return hook

    def at_z(layer):
        def hook(x, hook):  # (B, T, H, d_head)
            x = x.clone()
            for (la, h), new in z.items():
                if la == layer:
                    x[:, :, h] = new
            return x
        return hook

    hooks = [(f"blocks.{la}.attn.hook_pattern", at_pattern(la)) for la in range(L)]
    hooks += [(f"blocks.{la}.attn.hook_z", at_z(la)) for la in range(L)]
    valid = torch.ones_like(tokens, dtype=torch.bool)
    with torch.no_grad(), model.hooks(hooks):
        return _loss(model(tokens), tokens, valid)


def test_first_order_estimates_equal_small_exact_changes(mixed):
    """Each head's pattern moved a little towards an even spread, and its ``z`` moved a little: the estimates
    equal the patched forwards' loss changes to within their second-order remainder, window by window."""
    model, windows, _ = mixed
    tokens = torch.stack(windows[:4])  # (B, T)
    B, T = tokens.shape
    L, H = model.cfg.n_layers, model.cfg.n_heads
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    even = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]  # (Q, K): an even causal spread
    patterns = {(la, h): (1 - EPS) * cache[f"blocks.{la}.attn.hook_pattern"][:, h] + EPS * even
                for la in range(L) for h in range(H)}  # (B, Q, K) each
    gen = torch.Generator().manual_seed(0)
    ref = {la: cache[f"blocks.{la}.attn.hook_z"] + EPS / 4 * torch.randn(cache[f"blocks.{la}.attn.hook_z"].shape,
                                                                    generator=gen) for la in range(L)}
    valid = torch.ones_like(tokens, dtype=torch.bool)
    sub, _, _ = first_order(model, tokens, lambda lg, rows: _loss(lg, tokens[rows], valid[rows]).sum(), patterns, None)
    whole, _, _ = first_order(model, tokens, lambda lg, rows: _loss(lg, tokens[rows], valid[rows]).sum(), patterns,
                              None, chunk=B)  # one backward pass for every window: the same gradients
    assert all(torch.allclose(sub[at], whole[at], atol=1e-7) for at in patterns)
    clean = _forward(model, tokens)
    moved = 0
    for at, p in patterns.items():
        exact = _forward(model, tokens, pattern={at: p}) - clean  # (B,)
        assert sub[at] == pytest.approx(exact, abs=2e-5 + 0.05 * float(exact.abs().max()))
        moved += float(exact.abs().max()) > 1e-3
    assert moved >= 3  # the check is not of zeros
    for b in range(B):  # the mean ablation: one window, a reference a small step from its own z
        one = tokens[b:b + 1]
        mean = Replacement("mean", {la: ref[la][b:b + 1] for la in range(L)})
        loss = lambda lg, rows, one=one: _loss(lg, one[rows], torch.ones_like(one[rows], dtype=torch.bool)).sum()  # noqa: E731
        _, abl, _ = first_order(model, one, loss, {k: p[b:b + 1] for k, p in patterns.items()}, mean)
        for (la, h) in patterns:  # the central difference: the second-order term cancels, not the first
            z = cache[f"blocks.{la}.attn.hook_z"][b:b + 1, :, h]  # (1, T, d_head)
            step = ref[la][b:b + 1, :, h] - z
            exact = (_forward(model, one, z={(la, h): z + step}) - _forward(model, one, z={(la, h): z - step})) / 2
            assert abl[(la, h)] == pytest.approx(exact, abs=2e-5 + 0.05 * float(exact.abs().max()))


def test_estimate_runs_a_sample_exactly_and_labels_the_rest(mixed, monkeypatch):
    from headlens.atlas import firstorder

    monkeypatch.setattr(firstorder, "EXACT_LAYERS", 0)  # both of the planted model's layers are "first" ones
    model, windows, atlas = mixed
    held = windows[3::4]
    rules = candidate_rules()
    full, line = substitute(model, atlas.descriptions, held, rules, None, 8, subst="exact")
    est, est_line = substitute(model, atlas.descriptions, held, rules, None, 8, n_exact=1)
    by_full = {(d.layer, d.head): d for d in full}
    how = {(d.layer, d.head): d.evidence.get("share_how") for d in est}
    assert set(how.values()) == {"exact", "estimated"} and list(how.values()).count("exact") == 1  # all described
    (top,) = [at for at, h in how.items() if h == "exact"]
    size = {(d.layer, d.head): max(abs(d.evidence["est_abl"]), abs(d.evidence["est_subst"])) for d in est
            if d.evidence.get("share_how")}
    assert size[top] == max(size.values())  # the largest estimated effect is run exactly
    for d in est:
        at = (d.layer, d.head)
        if how[at] == "exact":  # the same numbers as the exact test
            assert (d.share_kept, d.share_ci, d.ablation_delta) == (by_full[at].share_kept, by_full[at].share_ci,
                                                                    by_full[at].ablation_delta)
        elif how[at] == "estimated":
            assert d.share_ci is None and d.ablation_delta == d.evidence["est_abl"] == by_full[at].evidence["est_abl"]
            assert d.share_kept is None  # not put back: no share kept, the estimate a hint in the evidence
    assert all(d.evidence["share_how"] in ("exact", "no_effect") for d in full if d.evidence.get("share_how"))
    assert line.how == "exact" and est_line.how == "estimated" and est_line.all_heads == pytest.approx(line.all_heads)
    assert est_line.exact_heads == 1 and line.exact_heads == len(size)
    for la, (n, loss) in est_line.per_layer.items():  # the layer's heads at once, to first order: the sum
        keys = [at for at in size if at[0] == la]
        assert n == len(keys) and loss == pytest.approx(
            line.clean + sum(d.evidence["est_subst"] for d in est if (d.layer, d.head) in keys), abs=1e-9)
    assert set(est_line.frame("m").how) == {"exact", "estimated"}


def test_the_first_layers_always_run_exactly(mixed, monkeypatch):
    from headlens.atlas import firstorder

    monkeypatch.setattr(firstorder, "EXACT_LAYERS", 1)
    model, windows, atlas = mixed
    out, line = substitute(model, atlas.descriptions, windows[3::4], candidate_rules(), None, 8, n_exact=0)
    picks = {(d.layer, d.head): (d.evidence["share_how"], d.evidence.get("exact_pick")) for d in out}
    assert picks == {at: (picks[at][0] if at[0] == 0 else "estimated", "layer" if at[0] == 0 else None) for at in picks}
    assert {picks[at][0] for at in picks if at[0] == 0} == {"exact", "no_effect"}  # run: a share, or no effect
    assert line.exact_heads == sum(at[0] == 0 for at in picks)
    _, exact_line = substitute(model, atlas.descriptions, windows[3::4], candidate_rules(), None, 8, subst="exact")
    assert line.layer_how == {0: "exact", 1: "estimated"} and line.how == "estimated"  # the first layer's line runs
    assert line.per_layer[0] == exact_line.per_layer[0] and line.per_layer_mean[0] == exact_line.per_layer_mean[0]
    assert list(line.frame("m").how) == ["exact"] * 4 + ["exact", "estimated"]  # all, the 3 best, layer 0, 1
    assert line.layers_alone() is None and exact_line.layers_alone() == pytest.approx(
        sum(v - exact_line.clean for _, v in exact_line.per_layer.values()))


def test_estimated_shares_are_labelled_on_the_page_and_in_the_table(mixed, tmp_path, monkeypatch):
    from dataclasses import replace

    from headlens.atlas import firstorder
    from headlens.atlas.site import write_site

    monkeypatch.setattr(firstorder, "EXACT_LAYERS", 0)
    model, windows, atlas = mixed
    out, sub = substitute(model, atlas.descriptions, windows[3::4], candidate_rules(), None, 8, n_exact=0)
    site = write_site(replace(atlas, descriptions=out, substitution=sub), tmp_path)
    table = replace(atlas, descriptions=out).descriptions_frame()
    assert set(table.share_how) == {"estimated"} and table.share_low[table.share_how == "estimated"].isna().all()
    assert table.share_kept[table.share_how == "estimated"].isna().all()  # a share kept is only ever measured
    d = next(d for d in out if d.evidence.get("est_share") == d.evidence.get("est_share"))
    page = (tmp_path / "heads" / f"L{d.layer}H{d.head}.html").read_text()
    assert "its share kept is not measured" in page and "a rough hint only" in page
    assert "(a first-order estimate)" in page and "were not put back" in site.read_text()


def test_an_unknown_substitution_mode_is_refused_before_the_pass(mixed):
    model, windows, _ = mixed
    with pytest.raises(ConfigError, match=r"subst='fast'.*estimate, exact"):
        build_atlas(model, AtlasConfig(k=3), windows=windows, subst="fast",
                    progress=lambda d, t: pytest.fail("the pass ran"))


def test_first_order_on_a_bridged_grouped_query_model(tmp_path):
    """Qwen2 (grouped-query: a head reads its key/value group's values): each head's pattern moved a little
    towards an even spread; the estimate equals the central difference of the model's own forward with the
    head's ``z`` moved by the same step either way at ``hook_z`` (``z = A @ v``)."""
    import transformers
    from hf_families import FAMILIES, build, save_tokenizer

    import headlens

    path = build("qwen2", tmp_path / "qwen2", tokenizer=False)
    getattr(transformers, FAMILIES["qwen2"].model).from_pretrained(path).eval().save_pretrained(path)
    save_tokenizer(path)
    model = headlens.load(f"hf:{path}")
    tokens = torch.randint(3, 60, (3, 20), generator=torch.Generator().manual_seed(0))
    T = tokens.shape[1]
    L, H = model.cfg.n_layers, model.cfg.n_heads
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    even = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]  # (Q, K)
    patterns = {(la, h): (1 - EPS) * cache[f"blocks.{la}.attn.hook_pattern"][:, h].float() + EPS * even
                for la in range(L) for h in range(H)}  # (B, Q, K)
    valid = torch.ones_like(tokens, dtype=torch.bool)
    sub, _, _ = first_order(model, tokens, lambda lg, rows: _loss(lg, tokens[rows], valid[rows]).sum(), patterns, None)

    def forward(la, h, step):
        def hook(z, hook):  # (B, T, H, d_head)
            z = z.clone()
            z[:, :, h] += step
            return z
        with torch.no_grad(), model.hooks([(f"blocks.{la}.attn.hook_z", hook)]):
            return _loss(model(tokens), tokens, valid)

    moved = 0
    for la, h in patterns:
        v = cache[f"blocks.{la}.attn.hook_v"]  # (B, T, H_kv, d_head)
        vh = v[:, :, h // (H // v.shape[2])].float()  # (B, T, d_head)
        step = EPS * (even @ vh - cache[f"blocks.{la}.attn.hook_z"][:, :, h].float())  # (B, T, d_head)
        exact = (forward(la, h, step) - forward(la, h, -step)) / 2
        assert sub[(la, h)] == pytest.approx(exact, abs=1e-6 + 0.02 * float(exact.abs().max()))
        moved += float(exact.abs().max()) > 1e-5
    assert moved >= H


def _autograd_z(model, tokens, valid, layer):
    """``layer``'s ``hook_z`` gradient of the windows' summed loss by plain autograd: that ``z`` made a leaf in a
    hook, one forward per layer (written without :func:`z_gradients`)."""
    leaf = {}

    def hook(z, hook):  # (B, T, H, d_head)
        leaf["z"] = z.detach().requires_grad_(True)
        return leaf["z"]
    with torch.enable_grad(), model.hooks([(f"blocks.{layer}.attn.hook_z", hook)]):
        loss = _loss(model(tokens), tokens, valid).sum()
        return torch.autograd.grad(loss, [leaf["z"]])[0]


@pytest.mark.parametrize("family", ["planted", "qwen2"])
def test_z_gradients_equal_plain_autograd_layer_by_layer(family, tmp_path):
    """The first-order pass's gradients (one backward, every layer's ``hook_z`` at once, through the later layers
    too) equal one plain autograd per layer, on a planted GPT and a bridged grouped-query Qwen2; the model's own
    ``.grad`` fields stay untouched."""
    from headlens.interventions.attribution import z_gradients

    if family == "planted":
        model = planted_gpt(mixture=True)
    else:
        import transformers
        from hf_families import FAMILIES, build, save_tokenizer

        import headlens

        path = build("qwen2", tmp_path / "qwen2", tokenizer=False)
        getattr(transformers, FAMILIES["qwen2"].model).from_pretrained(path).eval().save_pretrained(path)
        save_tokenizer(path)
        model = headlens.load(f"hf:{path}")
    tokens = torch.randint(3, min(40, int(model.cfg.d_vocab)), (3, 16), generator=torch.Generator().manual_seed(1))
    valid = torch.ones_like(tokens, dtype=torch.bool)
    L = model.cfg.n_layers
    _, grads = z_gradients(model, lambda: _loss(model(tokens), tokens, valid).sum(), range(L))
    assert all(p.grad is None for p in model.parameters())
    for la in range(L):
        torch.testing.assert_close(grads[la], _autograd_z(model, tokens, valid, la), rtol=1e-5, atol=1e-7)


def test_a_substitution_saved_before_its_newer_fields_still_reads():
    """``benchmarks/atlas.py --report`` reads pickles of earlier runs: a Substitution saved without
    ``layer_how`` and ``best`` unpickles with them empty and says its line."""
    import pickle

    from headlens.atlas.together import Substitution

    sub = Substitution(3.0, 3.3, (3.2, 3.4), 5, 8, {0: (5, 3.1)}, {0: 3.05})
    old = pickle.loads(pickle.dumps(sub).replace(b"layer_how", b"layer_old").replace(b"best", b"rest"))
    assert old.best == [] and old.layer_how == {} and old.sentence().startswith("all 5 described heads")
