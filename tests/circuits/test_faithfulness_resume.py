"""Faithfulness's node sets resumed from the every-head-ablated run equal one whole hooked forward each (the
reference, ``resume=False``): GQA (Llama), soft-caps and post-norms (Gemma 2), parallel attention and MLP with
partial rotary (GPT-NeoX), a sliding window shorter than the prompts (Mistral), ragged named positions with
padding, the IOI probe's answers-only logits, the empty set and every head."""

from __future__ import annotations

import warnings

import pytest
import torch

from headlens.circuits import faithfulness, resume
from headlens.circuits.api import setup
from headlens.circuits.faithfulness import Ablator

TOL = 1e-5
TEXTS = ["def main(argv):\n    return parse(argv) or exit(1) when the value is not None and the list is empty",
         "import os\nclass Reader(object):\n    pass",
         "for key, value in sorted(items.items()):\n    print(key, value, sep='=')\n    total += value",
         "while True: break"]


def _rows() -> list[dict]:
    """Prompts of 16 to 74 tokens (padded), A late, B early, C in the middle and missing from the second."""
    rows = []
    for i, t in enumerate(TEXTS):
        pos = {"A": [len(t) - 6, len(t) - 4], "B": [4, 7]}
        if i != 1:
            pos["C"] = [len(t) // 2, len(t) // 2 + 2]
        rows.append({"text": t, "positions": pos})
    return rows


def _sets(model, names: list[str], seed: int = 0) -> list[set]:
    """The empty set, every head (everywhere and at every named position), and random mixes of heads, layers and
    positions (``all`` included)."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    g = torch.Generator().manual_seed(seed)
    heads = [f"L{layer}H{h}" for layer in range(L) for h in range(H)]
    out = [set(), {(h, "all") for h in heads}, {(h, p) for h in heads for p in names}, {(heads[-1], names[0])}]
    for n in (1, 2, 3, 5):
        pick = torch.randperm(len(heads), generator=g)[:n].tolist()
        out.append({(heads[i], names[int(torch.randint(len(names), (1,), generator=g))]) for i in pick})
    out.append({(heads[0], "all"), (heads[-1], names[-1])})
    return out


def _compare(s, sets: list[set]) -> list[float]:
    ref = Ablator(s, resume=False)
    new = Ablator(s)
    assert new.resume and not ref.resume
    want = [ref.value(n) for n in sets]
    got = new.values(sets)
    assert max(abs(a - b) for a, b in zip(want, got, strict=True)) < TOL, (want, got)
    assert max(want) - min(want) > 1e-3  # the node sets do something
    return got


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt_neox", "mistral"])
def test_resumed_node_sets_equal_one_whole_forward_each(tmp_path, family, monkeypatch):
    from hf_families import build

    import headlens

    torch.set_num_threads(min(2, torch.get_num_threads()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = headlens.load(f"hf:{build(family, tmp_path / family)}")
    s = setup(model, "kl", "mean", prompts=_rows(), n_prompts=len(TEXTS))
    assert s.task.attention_mask is not None and not bool(s.task.attention_mask.all())  # padded: ragged ends
    sets = _sets(model, ["A", "B", "C"])
    got = _compare(s, sets)
    if family == "llama":  # prompts in blocks (a vocabulary's logits too large for one): the same values
        monkeypatch.setattr(faithfulness, "LOGIT_BUDGET", 3 * 4 * s.task.tokens.shape[1] * model.cfg.d_vocab)
        assert Ablator(s).values(sets) == pytest.approx(got, abs=TOL)
        init = resume.ResumePatcher.__init__

        def common(self, *args, **kwargs):  # positions from the earliest prompt's on, the same in every prompt
            init(self, *args, **kwargs)
            self.ragged = False

        monkeypatch.setattr(resume.ResumePatcher, "__init__", common)
        assert Ablator(s).values(sets) == pytest.approx(got, abs=TOL)


def test_resumed_ioi_runs_only_the_layers_and_positions_a_node_set_changes(tmp_path, monkeypatch):
    """logit_diff unembeds the two answers only; a node at END in the last layer runs one block at one position
    per prompt, a node at S2 from S2 on, every head at ``all`` every block at every position."""
    from tests.ioi_models import load_quietly, save_ioi_llama

    model = load_quietly(save_ioi_llama(tmp_path / "ioi", num_hidden_layers=3))
    s = setup(model, "logit_diff", "mean", prompts="ioi", n_prompts=8)
    runs: list[tuple[int, tuple[int, ...]]] = []
    block = resume.CleanRun.block

    def spy(self, model, layer, x, K, P=None):
        runs.append((layer, tuple(x.shape)))
        return block(self, model, layer, x, K, P)

    monkeypatch.setattr(resume.CleanRun, "block", spy)
    # a growing circuit, as the faithfulness curve's: each set resumes from the run of the one before, where a
    # later layer or position first differs
    nodes = [("L0H1", "S1+1"), ("L1H2", "S2"), ("L2H1", "END"), ("L2H3", "END"), ("L1H0", "END")]
    curve = [set(nodes[:i]) for i in range(1, len(nodes) + 1)]
    B, T = s.task.tokens.shape
    a = Ablator(s)
    steps = faithfulness.plan({None: a._keep(frozenset(), s.named, B, T)} |
                              {frozenset(n): a._keep(frozenset(n), s.named, B, T) for n in curve},
                              resume.ResumePatcher(model, s.task).positions)
    assert [(len(n), None if p is None else len(p), layer) for n, p, layer, _ in steps] == [
        (1, None, 0), (2, 1, 1), (3, 2, 2), (4, 3, 2), (5, 4, 1)]
    _compare(s, [*_sets(model, s.named.names, seed=1), *curve])
    lengths, idx = s.task.attention_mask.sum(1), s.named.index
    runs.clear()
    Ablator(s).values([{("L2H1", "END")}, {("L1H0", "S2")}, {("L0H0", "all")}])
    s2 = int((lengths - idx["S2"]).max())
    assert sorted(runs) == sorted([(2, (B, 1, 64)), (1, (B, s2, 64)), (2, (B, s2, 64)), (0, (B, T, 64)),
                                   (1, (B, T, 64)), (2, (B, T, 64))])


def test_models_without_the_resumed_path_run_whole_forwards():
    from tests.conftest import make_gpt

    model = make_gpt(n_layers=2)
    s = setup(model, "repeated_loss", "mean", n_prompts=3, seed=1)
    a = Ablator(s)
    assert not a.resume
    assert a.values([set(), {("L1H0", "all")}]) == [a.value(set()), Ablator(s, resume=False).value({("L1H0", "all")})]


@pytest.mark.slow
def test_smollm2_ioi_circuit_resumed_equals_whole_forwards(smollm2):
    """SmolLM2's IOI writers at END, then the heads that feed them at S2 and S1+1, grown as the faithfulness
    curve grows a circuit: the resumed values are the whole forwards' (a few forwards of a 30-layer model)."""
    s = setup(smollm2, "logit_diff", "mean", prompts="ioi", n_prompts=32)
    nodes = [("L23H3", "END"), ("L29H1", "END"), ("L23H0", "END"), ("L29H0", "END"), ("L24H4", "END"),
             ("L17H4", "S2"), ("L8H1", "S2"), ("L16H0", "S1+1")]
    sets = [set(), *(set(nodes[:i]) for i in (4, 5, 7, 8))]
    want = [Ablator(s, resume=False).value(n) for n in sets]
    got = Ablator(s).values(sets)
    assert max(abs(a - b) for a, b in zip(want, got, strict=True)) < 1e-4, (want, got)
    assert got[1] - got[0] > 1  # the writers alone recover logit difference
