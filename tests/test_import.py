"""``import headlens`` stays light: no transformer_lens, streamlit, plotly, pandas, transformers."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["transformer_lens", "streamlit", "plotly", "pandas", "transformers"]


def _imported_after(statement: str) -> list[str]:
    code = f"import sys, json; {statement}; print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_headlens_is_light():
    assert _imported_after("import headlens") == []


def test_loading_a_checkpoint_stays_light(tmp_path):
    path = tmp_path / "m.safetensors"
    statement = (
        "import headlens; "
        "m = headlens.GPT(headlens.ModelConfig(n_layers=1, n_heads=2, d_model=8, n_ctx=16, d_vocab=257)); "
        f"headlens.save_checkpoint(m, {str(path)!r}); "
        f"headlens.load({str(path)!r}).run_with_cache('hi')"
    )
    assert _imported_after(statement) == []


def test_bridge_module_imports_transformer_lens_lazily():
    assert _imported_after("import headlens.backends.bridge, headlens.export") == []
