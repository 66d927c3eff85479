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
            sums[f"mass:{name}"] = torch.stack([(pattern * hit[:, None, None]).sum((-2, -1)),
                                                has.sum(-1)[:, None, None].expand(grid),
                                                chance.sum(-1)[:, None, None].expand(grid)], -1)
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
