"""Your own head types: headlens.Detector, register_detector, entry points, module:attribute references."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import headlens
from headlens import detectors as registry
from headlens.scoring.table import read_table
from headlens.testing import planted_model
from tests.plugin_detectors import ONE_BACK, TWO_BACK

torch.set_num_threads(1)


@pytest.fixture
def clean_registry(monkeypatch):
    """Registry changes made by a test are undone after it."""
    monkeypatch.setattr(registry, "DETECTORS", dict(registry.DETECTORS))
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    monkeypatch.setattr(registry, "_entry_points", lambda: [])
    yield registry.DETECTORS


def two_back_model():
    """headlens.testing's planted model with L0H1 made to attend two tokens back (one-hot positions)."""
    model = planted_model()
    n_ctx, D, dh = model.cfg.n_ctx, model.cfg.d_model, model.cfg.d_head
    POS = model.cfg.d_vocab  # the position one-hots follow the token one-hots
    w = model.transformer.h[0].attn.c_attn.weight  # (3D, D): rows dh..2dh-1 of q and of k are head 1
    with torch.no_grad():
        for i in range(n_ctx):
            w[dh + i, POS + i] = 30.0 * dh ** 0.5  # q: position p -> e_p
            if i + 2 < n_ctx:
                w[D + dh + i + 2, POS + i] = 1.0  # k: position j -> e_{j+2}
    return model


def test_a_planted_two_back_head_scores_one(clean_registry):
    df = headlens.classify(two_back_model(), detectors=[TWO_BACK], n_prompts=12, seq_len=24, n_boot=100)
    score = {(int(r.layer), int(r.head)): r.score for r in df.itertuples()}
    assert score[0, 1] == pytest.approx(1.0) and score[0, 0] == pytest.approx(0.0)  # L0H0 looks one back
    assert score[1, 2] == pytest.approx(df.baseline.iloc[0])  # a uniform head sits at its baseline
    assert df[df.label][["layer", "head"]].values.tolist() == [[0, 1]]
    assert df.attrs["thresholds"]["two_back"] == 0.4
    assert "two_back" not in clean_registry  # passing the object does not register it


def test_registered_by_function_call_then_by_name(clean_registry):
    assert headlens.register_detector(TWO_BACK) is TWO_BACK
    df = headlens.classify(two_back_model(), detectors="two_back,previous_token", n_prompts=12, seq_len=24,
                           n_boot=100, threshold={"two_back": 0.9})
    labelled = {(r.layer, r.head, r.detector) for r in df[df.label].itertuples()}
    assert labelled == {(0, 1, "two_back"), (0, 0, "previous_token")}
    assert "two_back" in set(headlens.classify(two_back_model(), n_prompts=12, seq_len=24, n_boot=50).detector)


@pytest.mark.parametrize(("bad", "match"), [
    ("not a detector", "expects a headlens.Detector"),
    (headlens.Detector("previous_token", "index", len, "random_tokens", "x"), "already registered"),
    (headlens.Detector("x y", "index", len, "random_tokens", "x"), "without"),
    (headlens.Detector("odd", "pairs", len, "random_tokens", "x"), "kind 'pairs'"),
    (headlens.Detector("odd", "index", len, "my_probe", "x"), "probe 'my_probe'"),
])
def test_register_refuses_bad_detectors(clean_registry, bad, match):
    with pytest.raises(headlens.DetectorError, match=match):
        headlens.register_detector(bad)


def test_entry_points_load_lazily_and_a_broken_one_warns(clean_registry, monkeypatch):
    class EP:
        def __init__(self, name, value, obj):
            self.name, self.value, self._obj = name, value, obj

        def load(self):
            if isinstance(self._obj, Exception):
                raise self._obj
            return self._obj

    eps = [EP("two_back", "tests.plugin_detectors:TWO_BACK", TWO_BACK),
           EP("both", "pkg:make", lambda: [ONE_BACK]), EP("broken", "pkg:gone", ImportError("no module pkg"))]
    monkeypatch.setattr(registry, "_entry_points", lambda: eps)
    assert "two_back" not in clean_registry  # nothing loaded yet
    with pytest.warns(UserWarning, match="skipped detector plugin 'broken'"):
        det = registry.get_detector("two_back")
    assert det is TWO_BACK and "one_back" in clean_registry


def test_module_attribute_reference_from_the_cli(tmp_path):
    """The CLI scores a user detector named module:attribute (here a copy of previous_token)."""
    ckpt = tmp_path / "planted.safetensors"
    headlens.save_checkpoint(planted_model(), ckpt)
    out = tmp_path / "scores.csv"
    root = Path(__file__).parents[2]
    env = {"PYTHONPATH": f"{root}", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "headlens", "classify", "--model", str(ckpt), "--detectors",
                           "tests.plugin_detectors:ONE_BACK", "--n-prompts", "12", "--seq-len", "24", "--out",
                           str(out)], capture_output=True, text=True, env=env, cwd=root)
    assert proc.returncode == 0, proc.stderr
    df = read_table(out)
    assert set(df.detector) == {"one_back"} and df[df.label][["layer", "head"]].values.tolist() == [[0, 0]]


def test_docs_example_runs(clean_registry):
    text = (Path(__file__).parents[2] / "docs" / "detectors.md").read_text()
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(compile(block, "docs/detectors.md", "exec"), scope)
    table = scope["table"]
    assert set(table.detector) == {"two_back", "previous_token"} and "two_back" in clean_registry
    assert table[table.detector == "two_back"].score.max() < 0.4  # induction-2l has no two-back head


def _docs_block(containing: str) -> tuple[str, str]:
    """The first ```python block of the docs pages that contains ``containing``, and its page."""
    docs = Path(__file__).parents[2] / "docs"
    for page in ("detectors.md", "long-context.md"):
        path = docs / page
        blocks = path.read_text().split("```python\n")[1:] if path.exists() else []
        for block in (b.split("```", 1)[0] for b in blocks):
            if containing in block:
                return block, page
    raise AssertionError(f"no python example with {containing!r} in docs/detectors.md or docs/long-context.md")


def test_docs_predicate_example_runs(clean_registry, monkeypatch):
    """The docs' own head type defined by a predicate: it runs, its rule is what it says, and the scan scores it
    the same from the rule block by block (sparse, INDEX_MAX = 0) as from the index lists built from it (dense)."""
    from headlens.detectors.base import targets_to_mask
    from headlens.probes.base import ProbeBatch

    block, page = _docs_block("predicate=")
    scope: dict = {}
    exec(compile(block, page, "exec"), scope)
    det = next(v for v in scope.values() if isinstance(v, headlens.Detector) and v.predicate is not None)
    table = scope["table"]
    assert det.name in set(table.detector) and len(table) == 2 * 2 * 4  # two detectors x induction-2l's 2 x 4 heads
    x = torch.randint(5, 9, (1, 80), generator=torch.Generator().manual_seed(0))
    x[0, 0] = 0  # BOS, then 79 tokens of 4 kinds: copies near and far
    valid = torch.ones_like(x, dtype=torch.bool)
    got = targets_to_mask(det.targets(ProbeBatch(x, torch.tensor([80]), valid, x == 0, causal=True)), 80)[0]
    want = torch.zeros(80, 80, dtype=torch.bool)
    far = 0
    for q in range(1, 80):
        for k in range(1, q):
            want[q, k] = bool(x[0, k] == x[0, q]) and q - k <= 32
            far += bool(x[0, k] == x[0, q]) and q - k > 32
    assert torch.equal(got, want) and int(want.sum()) > 100 and far > 100
    model = headlens.load("induction-2l")
    kw = dict(detectors=[det], n_prompts=8, seq_len=64, n_boot=20)  # copies lie r <= 31 back: inside 32
    dense = headlens.classify(model, scan_path="dense", **kw)
    monkeypatch.setattr("headlens.scoring.scan.INDEX_MAX", 0)
    sparse = headlens.classify(model, scan_path="sparse", **kw)
    assert (dense.score - sparse.score).abs().max() <= 1e-6 and dense.score.max() > 0.01
