"""Nothing is swapped silently: a hand-made directory that asks for its own code, a tokenizer class this
transformers lacks and flash attention, loaded without ``--trust-remote-code``.

transformers runs its built-in Llama (the repository's ``modeling_mine.py`` never runs, rightly), a generic
tokenizer class and eager attention, and says nothing; headlens says each in one line and records them in
the scores table's provenance.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from gqa_models import save_llama

import headlens
from headlens.scoring.classification import classify

ROOT = Path(__file__).resolve().parents[2]


def _own_code_dir(root: Path, tokenizer_class: str | None = None, attn: str | None = None) -> Path:
    d = save_llama(root / "mine")
    config = json.loads((d / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_mine.MineConfig",
                          "AutoModelForCausalLM": "modeling_mine.MineForCausalLM"}
    if attn:
        config["attn_implementation"] = attn
    (d / "config.json").write_text(json.dumps(config))
    for name in ("configuration_mine.py", "modeling_mine.py"):
        (d / name).write_text("raise SystemExit('repository code ran')\n")
    if tokenizer_class:
        tok = json.loads((d / "tokenizer_config.json").read_text())
        (d / "tokenizer_config.json").write_text(json.dumps({**tok, "tokenizer_class": tokenizer_class}))
    return d


def _lines(caught) -> list[str]:
    return [str(w.message) for w in caught]


def test_own_code_replaced_by_a_builtin_class_is_one_warning_and_in_the_provenance(tmp_path):
    d = _own_code_dir(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = headlens.load(f"hf:{d}")
    notes = [m for m in _lines(caught) if "--trust-remote-code" in m]
    assert len(notes) == 1, _lines(caught)
    assert "modeling_mine.py" in notes[0] and "model_type='llama'" in notes[0]
    assert model.substitutions == notes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = classify(model, detectors=["previous_token"], n_prompts=4, seq_len=16, n_boot=20)
    assert table.attrs["substitutions"] == notes


def test_trusted_or_plain_directories_say_nothing(tmp_path):
    plain = save_llama(tmp_path / "plain")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = headlens.load(f"hf:{plain}")
    assert model.substitutions == [] and not [m for m in _lines(caught) if "instead" in m or "runs with" in m]


def test_missing_tokenizer_class_and_attention_implementation_are_one_line_each(tmp_path):
    d = _own_code_dir(tmp_path, tokenizer_class="MineTokenizer", attn="flash_attention_2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = headlens.load(f"hf:{d}")
    subs = model.substitutions
    assert len(subs) == 3, subs
    assert sum("tokenizer_class='MineTokenizer'" in s for s in subs) == 1
    assert sum("attn_implementation='flash_attention_2'" in s and "'eager'" in s for s in subs) == 1
    assert set(subs) <= set(_lines(caught))


def test_cli_prints_the_line_once_on_stderr(tmp_path):
    d = _own_code_dir(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "headlens", "classify", "--model", f"hf:{d}", "--detectors", "previous_token",
                           "--n-prompts", "4", "--seq-len", "16", "--out", str(tmp_path / "s.csv")],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "--trust-remote-code" in ln]
    assert len(lines) == 1 and lines[0].startswith("headlens: warning:"), proc.stderr
    assert "repository code ran" not in proc.stderr + proc.stdout
    from headlens.scoring.table import read_table

    meta = read_table(tmp_path / "s.csv").attrs
    assert meta["substitutions"] == [lines[0].removeprefix("headlens: warning: ")]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
