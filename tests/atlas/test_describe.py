"""The held-out sums a description is scored from: the streamed reductions equal a brute force on full patterns."""

from __future__ import annotations

import pytest
import torch

from headlens.atlas.heldout import _batch, heldout_stats
from headlens.atlas.rules import LATE, SINK_BANDS, candidate_rules, late_rules
from headlens.models.vocab import vocab
from tests.atlas.planted import planted_gpt, repeat_windows
from tests.conftest import make_gpt


def _reference(model, windows, batch_size):
    """The sums from every layer's whole pattern stacked in float64, each rule's whole prediction built as a
    ``(Q, K)`` matrix (first-token fallback included) and multiplied cell by cell."""
    from headlens.atlas.rules import rule_targets

    rules = candidate_rules()
    late = late_rules(rules)
    out = {}
    for start in range(0, len(windows), batch_size):
        batch = _batch(windows[start:start + batch_size], vocab(model).special)
        with torch.no_grad():
            logits, cache = model.run_with_cache(batch.tokens)
        pattern = torch.stack([cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(model.cfg.n_layers)],
                              1).double()  # (B, L, H, Q, K)
        T = pattern.shape[-1]
        q, k = torch.arange(T)[:, None], torch.arange(T)[None, :]
        cells = (k <= q) & batch.valid[:, None, :] & batch.query_ok[:, :, None]  # (B, Q, K)
        hits = {n: rule_targets(r, batch, T) * cells for n, r in rules.items() if n not in LATE}
        hits.update({n: t.double() for n, t in late(logits, batch, cells).items()})
        x = pattern * cells[:, None, None]  # (B, L, H, Q, K)
        grid = x.shape[:3]
        ok = batch.query_ok.double()
        eye = torch.eye(T, dtype=torch.bool)
        off = (x * ~eye * (k >= 1)).sum(-1)  # (B, L, H, Q)
        sums = {"rest": torch.stack([off.sum(-1), (x[..., 0] * ok[:, None, None]).sum(-1),
                                     ok.sum(-1)[:, None, None].expand(grid)], -1),
                "own": torch.stack([cells.double().sum((-2, -1))[:, None, None].expand(grid), x.sum((-2, -1)),
                                    (x * x).sum((-2, -1))], -1)}
        G = len(SINK_BANDS) + 1
        band = torch.zeros(T, G, dtype=torch.float64)  # each query position's band, counted edge by edge
        for i in range(T):
            band[i, sum(i >= e for e in SINK_BANDS)] = 1
        band = band * ok[..., None]  # (B, Q, G)
        sums["bfirst"] = torch.einsum("blhq,bqg->blhg", x[..., 0], band)
        sums["brows"] = band.sum(1)
        whole, part, has_all = [], [], []
        for name, w in hits.items():
            has = (w > 0).any(-1) & batch.query_ok  # (B, Q)
            y = torch.nan_to_num(w / w.sum(-1, keepdim=True))  # (B, Q, K)
            yt = y.clone()
            yt[:, :, 0] += (~has & batch.query_ok).double()
            whole.append(yt), part.append(y), has_all.append(has)
            hd = has.double()[:, None, None]  # (B, 1, 1, Q)
            for key, v in (("sxy", (x * yt[:, None, None]).sum((-2, -1))), ("csx", (x.sum(-1) * hd).sum(-1)),
                           ("csxx", ((x * x).sum(-1) * hd).sum(-1)), ("csxy", (x * y[:, None, None]).sum((-2, -1))),
                           ("cs0", (x[..., 0] * hd).sum(-1)),
                           ("on", (x * (w > 0)[:, None, None]).sum((-2, -1))),
                           ("bsxy", torch.einsum("blhq,bqg->blhg", (x * yt[:, None, None]).sum(-1), band))):
                sums.setdefault(key, []).append(v)
            n_t = (w > 0).sum(-1)
            for key, v in (("sy", yt.sum((-2, -1))), ("cn", (cells.sum(-1) * has).double().sum(-1)),
                           ("cy", y.sum((-2, -1))), ("cyy", (y * y).sum((-2, -1))),
                           ("cy0", y[..., 0].sum(-1)), ("has", has.double().sum(-1)),
                           ("bsy", torch.einsum("bq,bqg->bg", yt.sum(-1), band)),
                           ("by0", torch.einsum("bq,bqg->bg", yt[..., 0], band)),
                           ("chance", (n_t / (q[:, 0] + 1) * has).double().sum(-1))):
                sums.setdefault(key, []).append(v)
            if name == "predicted_token":
                even = (off * (n_t * has / (cells.sum(-1) - 2).clamp(min=1))[:, None, None]).sum(-1)
                sums["cs"] = torch.stack([sums["on"][-1], has.double().sum(-1)[:, None, None].expand(grid),
                                          sums["chance"][-1][:, None, None].expand(grid),
                                          (off * has[:, None, None]).sum(-1), even], -1)
        for key in ("sxy", "csx", "csxx", "csxy", "cs0", "on", "sy", "cn", "cy", "cyy", "cy0", "has", "chance", "bsxy",
                    "bsy", "by0"):
            sums[key] = torch.stack(sums[key], -1)
        Y = torch.stack(whole, -1)  # (B, Q, K, R)
        sums["gram"] = torch.einsum("bqkr,bqks->brs", Y, Y)
        sums["bgram"] = torch.einsum("bqkr,bqks,bqg->bgrs", Y, Y, band)
        sums["hasrow"] = torch.stack(has_all, -1)
        for key, value in sums.items():
            out.setdefault(key, []).append(value)
    T = max(v.shape[1] for v in out["hasrow"])
    out["hasrow"] = [torch.nn.functional.pad(v, (0, 0, 0, T - v.shape[1])) for v in out["hasrow"]]
    return {key: torch.cat(v) for key, v in out.items()}


@pytest.mark.parametrize("which", ["planted", "tiny"])
def test_streamed_heldout_sums_equal_a_brute_force_on_whole_patterns(which):
    if which == "planted":
        model = planted_gpt()
        windows = repeat_windows(model, 10, seed=4)
    else:
        model = make_gpt(seed=5)
        gen = torch.Generator().manual_seed(1)
        windows = [torch.cat([torch.tensor([256]), torch.randint(97, 105, (int(n),), generator=gen)])
                   for n in torch.randint(10, 30, (7,), generator=gen)]  # ragged: pads are never a query
    rules = candidate_rules()
    got = heldout_stats(model, windows, {n: r for n, r in rules.items() if n not in LATE}, late_rules(rules), 3)
    want = _reference(model, windows, 3)
    assert got.pop("names") == list(rules)
    assert set(got) == set(want)
    for key in want:  # float32 products inside a window, float64 after
        torch.testing.assert_close(got[key].double(), want[key].double(), rtol=1e-5, atol=1e-5, msg=key)
    i = list(rules).index("induction")
    assert want["csxy"][..., i].abs().sum() > 0  # the rules have targets on these windows


def test_longest_match_targets_equal_a_loop_over_earlier_copies():
    from headlens.atlas.rules import longest_match
    from headlens.probes.base import ProbeBatch

    gen = torch.Generator().manual_seed(3)
    tokens = torch.cat([torch.full((4, 1), 9), torch.randint(0, 4, (4, 40), generator=gen)], 1)  # (B, T): repeats
    B, T = tokens.shape
    batch = ProbeBatch(tokens, torch.full((B,), T), torch.ones(B, T, dtype=torch.bool), tokens == 9, True)
    got = longest_match(batch, torch.arange(T)[:, None], torch.arange(T)[None, :])  # (B, Q, K)
    for b in range(B):
        x = tokens[b].tolist()
        for q in range(1, T):
            def run(j, q=q, x=x):  # tokens that agree counting back from j and from q (BOS never matches)
                n = 0
                while j - n >= 1 and x[j - n] == x[q - n]:
                    n += 1
                return n
            lengths = {k: run(k - 1) for k in range(2, q) if x[k - 1] == x[q]}  # induction's targets, k <= q - 1
            best = max(lengths.values(), default=0)
            assert got[b, q].nonzero()[:, 0].tolist() == sorted(k for k, n in lengths.items() if n == best), (b, q)


def test_copy_suppression_needs_both_claims_and_a_rule_that_fits_wins():
    from headlens.atlas.describe import role_of

    ev = {"ov_label": 1.0, "pred_lo": 0.20, "pred_null": 0.08, "off_rest": 0.4, "main_weight": 0.7,
          "sink_weight": 0.3, "rule_coverage": 0.8, "cond_r": 0.1,
          "cond_coverage": 0.5, "cond_rule": 0, "cond_weight": 0.4, "cond_mass": 0.3, "cond_chance": 0.05}
    assert role_of("previous_token", 0.2, ev) == "copy_suppression"
    assert role_of("previous_token", 0.2, {**ev, "pred_lo": 0.07}) == "no clear role"  # not above the even spread
    assert role_of("previous_token", 0.2, {**ev, "ov_label": 0.0}) == "no clear role"  # its OV does not suppress
    assert role_of("previous_token", 0.2, {**ev, "ov_label": float("nan"), "off_rest": 0.1}) == "resting"
    assert role_of("previous_token", 0.8, ev) == "previous_token"  # a rule that fits names the role
    assert role_of("predicted_token", 0.6, ev) == "copy_suppression"
    assert role_of("induction_longest", 0.6, ev) == "induction"
    assert role_of("first_token", 0.9, ev) == "copy_suppression"  # a head resting between its claims' rows
    assert role_of("previous_token", 0.8, {**ev, "main_weight": 0.1, "ov_label": 0.0}) == "resting"
    cond = {**ev, "ov_label": 0.0, "cond_r": 0.8, "cond_rule": list(candidate_rules()).index("induction")}
    assert role_of("first_token", 0.9, cond) == "induction"  # does it where a repeat exists, rests elsewhere
    assert role_of("first_token", 0.9, {**cond, "cond_weight": 0.2}) == "resting"  # rests there too, mostly
    assert role_of("first_token", 0.9, {**cond, "cond_mass": 0.04}) == "resting"  # its targets get under chance
    assert role_of("first_token", 0.9, {**cond, "cond_coverage": 1.0}) == "resting"  # targets in every row
    none = {**ev, "ov_label": 0.0, "rule_coverage": 0.0}  # a rule with no target on held-out text: its fallback
    assert role_of("open_bracket", 0.9, none) == "resting"  # agrees, on the first token alone: a rest
    assert role_of("open_bracket", 0.3, none) == "no clear role"
    rest = {**ev, "ov_label": 0.0, "main_weight": 0.3, "sink_weight": 0.7}  # first_token 0.7 + uniform 0.3
    assert role_of("uniform", 0.9, rest) == "resting" and role_of("uniform", 0.9, {**ev, "ov_label": 0.0}) == "uniform"
    assert role_of("uniform", 0.9, {**rest, "ov_label": 1.0}) == "copy_suppression"  # its two claims, over a rest
