"""``import headlens`` stays light: no torch until a name needs it (so ``headlens --help`` and the
dashboard's server start at once), and no transformer_lens, streamlit, plotly, pandas, transformers
for native use.

One fresh interpreter per test (importing torch costs seconds) checks its stages in turn.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["transformer_lens", "streamlit", "plotly", "pandas", "transformers"]


def test_import_headlens_and_native_use_stay_light(tmp_path):
    path = str(tmp_path / "m.safetensors")
    code = f"""
import json, sys
heavy = lambda: sorted(m for m in {HEAVY!r} if m in sys.modules)
stages = {{}}
import headlens
stages["import headlens"] = heavy()
m = headlens.GPT(headlens.ModelConfig(n_layers=1, n_heads=2, d_model=8, n_ctx=16, d_vocab=257))
headlens.save_checkpoint(m, {path!r})
headlens.load({path!r}).run_with_cache("hi")
stages["save, load, run_with_cache"] = heavy()
import headlens.models.hf.bridge, headlens.models.export
stages["import the bridge and export modules"] = heavy()
print(json.dumps(stages))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    stages = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(stages) == 3 and all(v == [] for v in stages.values()), stages


def test_import_headlens_and_the_cli_do_not_import_torch():
    code = """
import json, sys
stages = {}
import headlens
stages["import headlens"] = "torch" in sys.modules
import headlens.cli, headlens.cli.dashboard
stages["import the CLI"] = "torch" in sys.modules
names = {n: type(getattr(headlens, n)).__name__ for n in headlens.__all__}
stages["torch after using the names"] = "torch" in sys.modules
import headlens.scoring.classification  # the submodule must not shadow the function of the same name
stages["classify is the function"] = callable(headlens.classify) and headlens.classify.__module__
print(json.dumps([stages, names]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    stages, names = json.loads(out.stdout.strip().splitlines()[-1])
    assert stages == {"import headlens": False, "import the CLI": False, "torch after using the names": True,
                      "classify is the function": "headlens.scoring.classification"}, stages
    assert names["GPT"] == names["HeadlensError"] == "type" and names["load"] == "function"
    assert names["sweep"] == "function"  # the table behind `headlens ablate`
    # everything exported is something to call: headlens.doctor (a package) stays importable but is not exported
    assert {n: t for n, t in names.items() if t not in ("function", "type") and n != "__version__"} == {}
