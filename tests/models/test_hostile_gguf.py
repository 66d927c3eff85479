"""A GGUF torn in its header is refused in one line naming the field out of range, before anything reaches
the cache; one torn in its data converts only when its weights are finite (else the line names the tensor);
and the honest file's scores are the same after either."""

from __future__ import annotations

import random
import shutil
import struct

import pytest
from typer.testing import CliRunner

pytest.importorskip("gguf")

from headlens.cli import app
from headlens.errors import CheckpointError
from headlens.models.hf.gguf_file import n_bytes, read_header
from tests.gguf_files import tiny_model, write_gguf
from tests.models.test_fuzz_readers import smollm2_gguf

runner = CliRunner()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("HEADLENS_CACHE", str(root))
    return root


def entries(cache) -> list[str]:
    """The converted models in the cache (the sha256 memo is not one)."""
    folder = cache / "gguf"
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def scores(model: str, out) -> str:
    result = runner.invoke(app, ["classify", "-m", model, "-d", "previous_token", "--n-prompts", "4", "-q", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out.read_text()


def test_the_torn_smollm2_is_refused_in_one_line_naming_the_field(tmp_path, cache):
    torn = tmp_path / "torn.gguf"
    shutil.copy(smollm2_gguf(), torn)
    with open(torn, "r+b") as f:  # a few bytes flipped: the top byte of the first key's length
        f.seek(24 + 7)
        f.write(b"\x7f")
    result = runner.invoke(app, ["classify", "--model", f"gguf:{torn}"])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 3 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith(f"headlens: error: {str(torn)!r} is a truncated or corrupt GGUF file: the length "
                               f"of metadata key 1 is 9,151,314,442,816,847,892 bytes at byte 24, past the end")
    assert entries(cache) == []


@pytest.mark.parametrize(("field", "at", "value", "said"), [
    ("tensor count", 8, 2**62, "the tensor count is 4,611,686,018,427,387,904"),
    ("metadata count", 16, 2**40, "the metadata count is 1,099,511,627,776"),
])
def test_a_huge_count_is_named(tmp_path, field, at, value, said):
    path = write_gguf(*tiny_model("llama"), tmp_path / "m.gguf", "Q8_0")
    blob = bytearray(path.read_bytes())
    struct.pack_into("<Q", blob, at, value)
    path.write_bytes(blob)
    with pytest.raises(CheckpointError, match=said):
        read_header(path)


def _poison(path, tensor_name: str, value: float) -> None:
    header = read_header(path)
    entry = next(t for t in header.tensors if t.name == tensor_name)
    assert n_bytes(entry) >= 4 and entry.ggml_type == 0  # an F32 tensor: its first value is 4 bytes
    with open(path, "r+b") as f:
        f.seek(header.data_start + entry.offset)
        f.write(struct.pack("<f", value))


def test_weights_that_are_not_finite_are_named_and_nothing_is_cached(tmp_path, cache):
    honest = write_gguf(*tiny_model("llama"), tmp_path / "honest.gguf", "Q8_0")
    before = scores(f"gguf:{honest}", tmp_path / "before.csv")
    torn = tmp_path / "torn.gguf"
    shutil.copy(honest, torn)
    _poison(torn, "blk.0.attn_norm.weight", float("nan"))
    kept = entries(cache)
    result = runner.invoke(app, ["classify", "-m", f"gguf:{torn}", "--n-prompts", "4"])
    line = result.stderr.strip()
    assert result.exit_code == 3 and "\n" not in line and "Traceback" not in result.output, result.output
    assert "tensor 'model.layers.0.input_layernorm.weight' holds 1 NaN and 0 inf values" in line, line
    assert entries(cache) == kept  # the failed conversion left no partial entry
    assert scores(f"gguf:{honest}", tmp_path / "after.csv") == before


def test_flipped_data_bytes_convert_to_finite_scores_or_are_named(tmp_path, cache):
    """A flip in a quantized block's data or scale: whatever it dequantizes to, the run is finite or says
    which tensor is not."""
    honest = write_gguf(*tiny_model("llama"), tmp_path / "honest.gguf", "Q8_0")
    header = read_header(honest)
    blob = honest.read_bytes()
    rng = random.Random(0)
    for case in range(3):
        torn = bytearray(blob)
        for _ in range(16):
            torn[rng.randrange(header.data_start, len(blob))] ^= rng.randrange(1, 256)
        path = tmp_path / f"torn{case}.gguf"
        path.write_bytes(torn)
        result = runner.invoke(app, ["classify", "-m", f"gguf:{path}", "-d", "previous_token", "--n-prompts", "4", "-q",
                                     "-o", str(tmp_path / f"torn{case}.csv")])
        if result.exit_code == 0:
            import pandas as pd

            table = pd.read_csv(tmp_path / f"torn{case}.csv")
            assert table["score"].notna().all(), table
        else:
            line = result.stderr.strip()
            assert result.exit_code == 3 and "\n" not in line and "holds" in line and "tensor '" in line, line
