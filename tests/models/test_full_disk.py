"""A full disk mid-write (a write patched to raise ``ENOSPC`` after half its bytes) loses nothing: the scores
table and its sidecar, an atlas folder and the GGUF cache keep their previous content, no temporary file
stays behind, and the command says so in one line."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from headlens.cli import app
from headlens.errors import OutputError
from headlens.models.files import atomic_folder, write_text

runner = CliRunner()


def half_then_full(write):
    """``DataFrame.to_csv(self, path, ...)`` that writes half of what it would, then finds the disk full."""
    def patched(self, path, *args, **kwargs):
        write(self, path, *args, **kwargs)
        data = Path(path).read_bytes()
        Path(path).write_bytes(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return patched


def half_text_then_full(write_text):
    """``Path.write_text`` that writes half of the text, then finds the disk full."""
    def patched(self, data, *args, **kwargs):
        write_text(self, data[: len(data) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return patched


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from headlens.models.checkpoint import save_checkpoint
    from headlens.testing import planted_model

    return str(save_checkpoint(planted_model(), tmp_path_factory.mktemp("disk") / "planted.safetensors"))


@pytest.mark.parametrize("which", ["table", "sidecar"])
def test_scores_and_their_sidecar_survive_a_full_disk(ckpt, tmp_path, monkeypatch, which):
    out = tmp_path / "scores.csv"
    args = ["classify", "-m", ckpt, "-q", "-o", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    before = snapshot(tmp_path)
    assert set(before) == {"scores.csv", "scores.csv.json"}
    if which == "table":
        monkeypatch.setattr(pd.DataFrame, "to_csv", half_then_full(pd.DataFrame.to_csv))
    else:
        monkeypatch.setattr(Path, "write_text", half_text_then_full(Path.write_text))
    result = runner.invoke(app, [*args, "--seed", "1"])
    lines = [ln for ln in result.stderr.strip().splitlines() if not ln.startswith("headlens: warning:")]
    assert result.exit_code == 7 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert "No space left on device; the previous file is kept unchanged" in lines[0]
    assert snapshot(tmp_path) == before  # both files as they were, no temporary file left


def test_write_text_keeps_the_previous_file(tmp_path, monkeypatch):
    path = write_text(tmp_path / "a.txt", "old")
    monkeypatch.setattr(Path, "write_text", half_text_then_full(Path.write_text))
    with pytest.raises(OutputError, match=r"'.*a\.txt': No space left on device; the previous file is kept"):
        write_text(path, "new" * 1000)
    monkeypatch.undo()
    assert path.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["a.txt"]


def test_an_atlas_folder_is_swapped_whole_or_kept(tmp_path):
    site = tmp_path / "site"
    atomic_folder(site, lambda d: (d / "index.html").write_text("first"))
    (site / "notes.txt").write_text("the user's own")

    def full(d: Path) -> None:
        (d / "index.html").write_text("second, half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    before = snapshot(tmp_path)
    with pytest.raises(OutputError, match="No space left on device; the previous folder is kept unchanged"):
        atomic_folder(site, full)
    assert snapshot(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["site"]
    atomic_folder(site, lambda d: (d / "index.html").write_text("third"))
    assert snapshot(site) == {"index.html": b"third", "notes.txt": b"the user's own"}
    assert sorted(os.listdir(tmp_path)) == ["site"]


def test_a_full_disk_during_a_gguf_conversion_leaves_the_cache_as_it_was(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    from headlens.models.hf import gguf_convert
    from tests.gguf_files import tiny_model, write_gguf

    cache = tmp_path / "cache"
    monkeypatch.setenv("HEADLENS_CACHE", str(cache))
    path = write_gguf(*tiny_model("llama"), tmp_path / "m.gguf", "Q8_0")

    def full(self, name, tensor):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(gguf_convert._StreamedSafetensors, "add", full)
    result = runner.invoke(app, ["classify", "-m", f"gguf:{path}", "-q"])
    lines = [ln for ln in result.stderr.strip().splitlines() if not ln.startswith("headlens: warning:")]
    assert result.exit_code == 7 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert "No space left on device; nothing was kept" in lines[0]
    assert sorted(p.name for p in (cache / "gguf").iterdir()) == ["sha256.json"]  # no entry, whole or partial
