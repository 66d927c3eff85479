"""The held-out sums a description is scored from: the streamed reductions equal a brute force on full patterns."""

from __future__ import annotations

import pytest
import torch

from headlens.atlas.heldout import _batch, heldout_stats
from headlens.atlas.rules import LATE, candidate_rules, late_rules
from headlens.detectors.base import predicate_mask
from headlens.models.vocab import vocab
from tests.atlas.planted import planted_gpt, repeat_windows
from tests.conftest import make_gpt


def _reference(model, windows, batch_size):
    """The sums from every layer's whole pattern stacked in float64, one elementwise product per rule."""
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
        cells = (k >= 1) & (k < q) & batch.valid[:, None, :] & batch.query_ok[:, :, None]  # (B, Q, K)
        hits = {n: predicate_mask(r.predicate, batch, 0, T, 0, T) & cells for n, r in rules.items() if n not in LATE}
        hits.update(late(logits, batch, cells))
        x = pattern * cells[:, None, None]  # (B, L, H, Q, K)
        grid = x.shape[:3]
        sx, sxx = x.sum((-2, -1)), (x * x).sum((-2, -1))
        first = (pattern[..., 0] * batch.query_ok[:, None, None]).sum(-1)
        rows = batch.query_ok.double().sum(-1)[:, None, None].expand(grid)
        sums = {"rest": torch.stack([sx, first, rows], -1)}
        for name, hit in hits.items():
            n_t = hit.sum(-1)  # (B, Q)
            y = (hit.double() / n_t[..., None].clamp(min=1))[:, None, None]  # (B, 1, 1, Q, K)
            n = cells.double().sum((-2, -1))[:, None, None].expand(grid)
            sums[f"corr:{name}"] = torch.stack([n, sx, y.sum((-2, -1)).expand(grid), sxx,
                                                (y * y).sum((-2, -1)).expand(grid), (x * y).sum((-2, -1))], -1)
            has = (n_t > 0).double()
            chance = (n_t / (q[:, 0] + 1)).double() * has
            row = x.sum(-1)  # (B, L, H, Q): each row's off-rest attention
            even = (row * (n_t / cells.sum(-1).clamp(min=1).double())[:, None, None]).sum(-1)
            sums[f"mass:{name}"] = torch.stack([(pattern * hit[:, None, None]).sum((-2, -1)),
                                                has.sum(-1)[:, None, None].expand(grid),
                                                chance.sum(-1)[:, None, None].expand(grid),
                                                (row * has[:, None, None]).sum(-1), even], -1)
        for key, value in sums.items():
            out.setdefault(key, []).append(value)
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
    assert set(got) == set(want)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-9, atol=1e-9, msg=key)
    assert want["corr:induction"][..., 5].abs().sum() > 0  # the rules have targets on these windows


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

    ev = {"ov_label": 1.0, "pred_lo": 0.20, "pred_null": 0.08, "off_rest": 0.4}
    assert role_of("previous_token", 0.2, ev) == "copy_suppression"
    assert role_of("previous_token", 0.2, {**ev, "pred_lo": 0.07}) == "no clear role"  # not above the even spread
    assert role_of("previous_token", 0.2, {**ev, "ov_label": 0.0}) == "no clear role"  # its OV does not suppress
    assert role_of("previous_token", 0.2, {**ev, "ov_label": float("nan"), "off_rest": 0.1}) == "resting"
    assert role_of("previous_token", 0.8, ev) == "previous_token"  # a rule that fits names the role
    assert role_of("predicted_token", 0.6, ev) == "copy_suppression"
    assert role_of("induction_longest", 0.6, ev) == "induction"
