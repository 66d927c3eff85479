"""Induction by distance, a known answer on the planted induction head and the curve table."""

from __future__ import annotations

import pytest
import torch

from headlens.scoring.induction_distance import detector, gap_probe, gaps, induction_curve
from headlens.scoring.scan import scan
from headlens.testing import planted_model


@pytest.fixture(scope="module")
def model():
    return planted_model(n_ctx=200)


def test_planted_head_splits_its_mass_over_every_earlier_copy(model):
    """L1H0 attends to every token after an earlier x_q alike: on a row with n such tokens the planted
    copy gets exactly 1/n, so the score at gap g is the mean of 1/n over the rows inside the copy."""
    g = 96
    probe = gap_probe(model, 3, g, torch.Generator().manual_seed(0))
    assert {len(p) for p in probe.prompts} == {1 + 16 + g + 32}
    out = scan(model, probe, [detector(g)], batch_size=3, path="sparse")[f"induction@{g}"]
    # by hand, from the token lists: [BOS] + 16 prefix + r + filler, the second r starts at 1 + 16 + g;
    # its first row has no earlier copy of r before it, so rows 1 + 16 + g + 1 .. end are scored.
    # n(q) = #{k : 2 <= k <= q - 1, x_{k-1} == x_q} (k - 1 = 0 is BOS, never a copy)
    start = 1 + 16 + g
    inverse_n = []
    for prompt in probe.prompts:
        x = prompt.tolist()
        assert x[start:] == x[17:17 + 32]  # the second r copies the first, g tokens later
        for q in range(start + 1, len(x)):
            n = sum(x[k - 1] == x[q] for k in range(2, q))
            inverse_n.append(1.0 / n)
    assert len(inverse_n) == 3 * 31 and int(out.counts.sum()) == 3 * 31
    expected = sum(inverse_n) / len(inverse_n)
    assert expected < 0.99  # the small alphabet repeats tokens: the planted head does split its mass
    assert float(out.sums[:, 1, 0].sum() / out.counts.sum()) == pytest.approx(expected, abs=1e-6)


def test_curve_table_and_figure(model):
    from headlens.viz import induction_distance_figure

    assert gaps(200) == [64, 128] and gaps(40_000)[-1] == 32768
    curve = induction_curve(model, n_prompts=3, n_boot=50)
    assert list(curve.gap.unique()) == [64, 128] and len(curve) == 2 * model.n_layers * model.n_heads
    top = curve[(curve.layer == 1) & (curve["head"] == 0)]
    assert (top.ci_low > 5 * top.baseline).all()  # far above uniform at both gaps
    assert set(curve.attrs["scan_path"].values()) <= {"dense", "sparse"}
    fig = induction_distance_figure(curve, top=2)
    assert fig.data[0].name == "L1H0"
