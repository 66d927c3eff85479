"""The sharded exemplar pass: shards merged equal one pass, and two torchrun ranks write the one-process atlas."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from headlens.atlas.exemplars import AtlasConfig, exemplar_pass
from headlens.atlas.shards import merge
from tests.conftest import make_gpt, run_cli

ROOT = Path(__file__).resolve().parents[2]


def _windows(n: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.cat([torch.tensor([256]), torch.randint(97, 123, (int(t),), generator=gen)])
            for t in torch.randint(12, 30, (n,), generator=gen)]


def _key(ex):
    return {name: [[(e.window, e.position, round(e.score, 6)) for e in kept] for kept in heads]
            for name, heads in ex.top.items()}


def test_merged_shards_equal_one_pass():
    model = make_gpt(seed=5, attn_only=True, normalization="none")
    windows = _windows(10)
    config = AtlasConfig(k=4, batch_size=2)
    whole = exemplar_pass(model, windows, config)
    parts = [exemplar_pass(model, windows[:6], config), exemplar_pass(model, windows[6:], config, first=6)]
    merged = merge(parts, config.k)
    assert _key(merged) == _key(whole)
    assert torch.allclose(merged.profile.mass, whole.profile.mass, atol=1e-9)
    assert merged.profile.rows == whole.profile.rows and merged.n_tokens == whole.n_tokens


def test_many_chunks_folded_in_one_process_equal_one_pass(monkeypatch):
    """One process folds each chunk into its running lists as it goes (it keeps one chunk's lists at a time,
    not all of them: the pass's memory must not grow with the corpus); the result is the one pass's."""
    import headlens.atlas.shards as shards

    monkeypatch.setattr(shards, "CHUNK_BATCHES", 1)  # 5 chunks of one batch
    model = make_gpt(seed=5, attn_only=True, normalization="none")
    windows = _windows(10)
    config = AtlasConfig(k=4, batch_size=2)
    whole = exemplar_pass(model, windows, config)
    folded = shards.sharded_pass(model, windows, config)
    assert _key(folded) == _key(whole)
    assert torch.allclose(folded.profile.mass, whole.profile.mass, atol=1e-9)
    assert folded.profile.rows == whole.profile.rows and folded.n_tokens == whole.n_tokens


@pytest.mark.parametrize("family", [None, "gemma3"])
def test_a_kept_write_holds_its_own_vector_only(family, tmp_path):
    """An exemplar's write vector owns its D floats and nothing more: a view into the batch's ``(n, D)`` block
    of writes kept that whole block alive for as long as one exemplar of it survived, and the pass's peak grew
    with the corpus (0.5 GiB per 1000 SmolLM2 windows). Both write paths: linear, and a post-attention norm."""
    import headlens

    if family is None:
        model = make_gpt(seed=5, attn_only=True, normalization="none")
    else:
        from hf_families import build
        model = headlens.load(f"hf:{build(family, tmp_path / family)}")
    ex = exemplar_pass(model, _windows(10), AtlasConfig(k=4, batch_size=4), read_tokens=False)
    writes = [e.write for name, heads in ex.top.items() if name != "sample" for kept in heads for e in kept]
    assert writes and all(w is not None and w.shape == (model.cfg.d_model,) for w in writes)
    assert all(w.untyped_storage().nbytes() == w.numel() * w.element_size() for w in writes)
    assert all(e.write is None for kept in ex.top["sample"] for e in kept)  # a sampled row's write is not read


@pytest.mark.skipif(sys.platform != "linux", reason="gloo on the loopback interface")
def test_two_torchrun_ranks_write_the_one_process_atlas(monkeypatch, capsys, tmp_path):
    corpus = tmp_path / "letters.txt"
    corpus.write_text("\n".join("xyz" + "abcdefgh"[i:] + "klmnop" * 5 for i in range(8)))
    args = ["atlas", "--model", "induction-2l", "--corpus", str(corpus), "--n-windows", "8", "--k", "3",
            "--batch-size", "2", "--quiet"]
    code, _, err = run_cli(monkeypatch, capsys, *args, "--out", str(tmp_path / "one"))
    assert code == 0, err
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "GLOO_SOCKET_IFNAME": "lo", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "headlens",
           *args, "--out", str(tmp_path / "two")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    one, two = (pd.read_parquet(tmp_path / d / "exemplars.parquet") for d in ("one", "two"))
    pd.testing.assert_frame_equal(one.drop(columns="score"), two.drop(columns="score"))
    assert (one["score"] - two["score"]).abs().max() < 1e-6
    assert pd.read_csv(tmp_path / "one" / "descriptions.csv").equals(pd.read_csv(tmp_path / "two" / "descriptions.csv"))


def test_a_resumed_run_loads_its_chunks_and_writes_the_same_atlas(monkeypatch, capsys, tmp_path):
    import headlens.atlas.shards as shards

    corpus = tmp_path / "letters.txt"
    corpus.write_text("\n".join("xyz" + "abcdefgh"[i:] + "klmnop" * 5 for i in range(12)))
    args = ["atlas", "--model", "induction-2l", "--corpus", str(corpus), "--n-windows", "12", "--k", "3",
            "--batch-size", "1", "--quiet", "--resume", str(tmp_path / "shards")]
    monkeypatch.setattr(shards, "CHUNK_BATCHES", 3)  # 9 windows seen: three chunks
    code, _, err = run_cli(monkeypatch, capsys, *args, "--out", str(tmp_path / "first"))
    assert code == 0, err
    assert len(list((tmp_path / "shards" / "atlas").glob("*.safetensors"))) == 3

    def no_pass(*a, **kw):
        raise AssertionError("a resumed run streamed a chunk it had on disk")

    monkeypatch.setattr(shards, "exemplar_pass", no_pass)
    code, _, err = run_cli(monkeypatch, capsys, *args, "--out", str(tmp_path / "again"))
    assert code == 0, err
    first, again = (pd.read_parquet(tmp_path / d / "exemplars.parquet") for d in ("first", "again"))
    pd.testing.assert_frame_equal(first, again, check_exact=False, atol=1e-6)
