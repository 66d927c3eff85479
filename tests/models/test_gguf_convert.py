"""The GGUF conversion one tensor at a time (:mod:`headlens.models.hf.gguf_convert`): byte for byte the
weights transformers' own loader gives, in every family tests/gguf_files.py writes and in the dtype asked
for; and a conversion whose peak memory does not grow with the model (measured in a child process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")

from headlens.models.hf import gguf as hg
from tests.gguf_files import _families, tiny_model, write_gguf

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("HEADLENS_CACHE", str(root))
    return root


def safetensors_dtypes(path: Path) -> set[str]:
    """The dtypes a safetensors file's header declares (read without the library under test's help)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return {entry["dtype"] for key, entry in header.items() if key != "__metadata__"}


CASES = [(family, dtype, "Q8_0") for family in _families() for dtype in ("float32", "bfloat16")]


@pytest.mark.parametrize(("family", "dtype", "qtype"), [*CASES, ("llama", "bfloat16", "F16"), ("qwen2", "float32", "Q4_1")])
def test_the_cache_holds_what_transformers_loader_gives_byte_for_byte(family, dtype, qtype, tmp_path, cache):
    from transformers import AutoModelForCausalLM

    hf_model, tok = tiny_model(family)
    path = write_gguf(hf_model, tok, tmp_path / f"{family}.gguf", qtype)
    folder, _ = hg.converted(path, dtype)
    torch_dtype = getattr(torch, dtype)
    reference = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch_dtype)
    ours = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch_dtype)
    want, got = reference.state_dict(), ours.state_dict()
    assert sorted(got) == sorted(want)
    for key, tensor in want.items():  # bitwise: the same dequantize, processor and cast
        assert got[key].dtype == tensor.dtype == torch_dtype, key
        assert torch.equal(got[key].view(torch.int16 if dtype == "bfloat16" else torch.int32),
                           tensor.view(torch.int16 if dtype == "bfloat16" else torch.int32)), key
    assert safetensors_dtypes(folder / "model.safetensors") == {"BF16" if dtype == "bfloat16" else "F32"}
    assert json.loads((folder / "config.json").read_text())["dtype"] == dtype
    assert json.loads((folder / hg.MARKER).read_text())["dequantized_to"] == dtype


def test_each_dtype_has_its_own_cache_folder(tmp_path, cache):
    hf_model, tok = tiny_model("llama")
    path = write_gguf(hf_model, tok, tmp_path / "llama.gguf", "Q8_0")
    f32, _ = hg.converted(path)
    bf16, _ = hg.converted(path, torch.bfloat16)
    assert f32 != bf16 and "-float32-" in f32.name and "-bfloat16-" in bf16.name
    assert hg.converted(path, "bf16")[0] == bf16  # any spelling of the dtype: the same folder
    assert (bf16 / "model.safetensors").stat().st_size < 0.6 * (f32 / "model.safetensors").stat().st_size
    from transformers import modeling_gguf_pytorch_utils as readers

    assert readers.load_gguf_checkpoint.__module__ == readers.__name__  # the header memo is gone after use


CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from headlens.models.hf import gguf as hg

    def status(key):
        line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))
        return int(line.split()[1]) * 1024

    hg.converted(Path(sys.argv[1]), "bfloat16")  # every lazy import done on a tiny file first
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        reset = True
    except OSError:
        reset = False
    before = status("VmRSS")
    folder, _ = hg.converted(Path(sys.argv[2]), "bfloat16")
    print(json.dumps({"before": before, "peak": status("VmHWM"), "reset": reset, "folder": str(folder)}))
""")


def test_a_conversion_to_bfloat16_stays_under_its_float32_weights(tmp_path, cache):
    """~170 MB of float32 weights (6 layers of width 768), converted to bfloat16 in a child process whose
    resident peak, above what it held before, must stay under half of them: under the bfloat16 model
    itself, let alone the float32 one transformers' loader would build."""
    small, tok = tiny_model("llama")
    warm = write_gguf(small, tok, tmp_path / "warm.gguf", "F32")
    big, tok = tiny_model("llama", hidden_size=768, intermediate_size=2048, num_hidden_layers=6,
                          num_attention_heads=12, num_key_value_heads=12, head_dim=64)
    f32_bytes = sum(p.numel() * 4 for p in big.parameters())
    path = write_gguf(big, tok, tmp_path / "big.gguf", "F32")
    del big
    assert f32_bytes > 150e6
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", CHILD, str(warm), str(path)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    grew = got["peak"] - got["before"]
    assert grew < f32_bytes / 2, f"the conversion grew the child by {grew / 1e6:.0f} MB for {f32_bytes / 1e6:.0f} MB"
    weights = Path(got["folder"]) / "model.safetensors"
    assert safetensors_dtypes(weights) == {"BF16"}
    assert weights.stat().st_size < f32_bytes / 2 + 1e6  # bfloat16 on disk, not float32
