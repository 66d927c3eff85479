"""The package layout holds: imports point one way along the pipeline, no cycles, nothing flat, no giants."""

from __future__ import annotations

import shutil
from pathlib import Path

import headlens
from tests.layout_rules import ORDER, cycles, direction_errors

ROOT = Path(headlens.__file__).parent
FLAT_ALLOWED = {"__init__.py", "__main__.py", "errors.py", "progress.py", "testing.py"}
MAX_LINES = 420  # "~400": a module past this is split where a split reads better


def test_imports_point_one_way():
    errors = direction_errors(ROOT)
    assert not errors, "imports against the pipeline (" + " -> ".join(ORDER) + "):\n" + "\n".join(errors)


def test_no_import_cycles():
    found = cycles(ROOT)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_every_package_of_the_pipeline_exists_and_nothing_sits_flat():
    assert {p.name for p in ROOT.iterdir() if p.is_file() and p.suffix == ".py"} == FLAT_ALLOWED
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(ORDER) - {"circuits"} or packages == set(ORDER), packages


def test_no_module_is_a_giant():
    big = {str(p.relative_to(ROOT.parent)): n for p in ROOT.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "headlens"
    shutil.copytree(ROOT, root, ignore=shutil.ignore_patterns("weights", "cards", "__pycache__"))
    return root


def test_a_planted_upward_import_is_named(tmp_path):
    root = _copy(tmp_path)
    config = root / "models" / "config.py"
    config.write_text(config.read_text() + "\n\ndef _late():\n    from headlens.scoring.table import validate\n")
    errors = direction_errors(root)
    assert len(errors) == 1, errors
    assert "headlens/models/config.py" in errors[0] and "headlens.scoring.table" in errors[0]
    assert "models/ comes before scoring/" in errors[0]


def test_a_planted_top_level_shortcut_and_a_stray_module_are_named(tmp_path):
    root = _copy(tmp_path)
    (root / "stray.py").write_text("from headlens.errors import HeadlensError\n")
    probes = root / "probes" / "base.py"
    probes.write_text(probes.read_text() + "\nfrom headlens import classify\nfrom headlens import stray\n")
    errors = direction_errors(root)
    assert any("'classify' from the top-level headlens" in e for e in errors), errors
    assert any("headlens.stray, which is in no package" in e for e in errors), errors


def test_a_planted_cycle_inside_a_package_is_found(tmp_path):
    root = _copy(tmp_path)
    grid = root / "viz" / "grid.py"
    grid.write_text(grid.read_text() + "\n\ndef _late():\n    from headlens.viz.figures import figure_html\n")
    assert ["headlens.viz.figures", "headlens.viz.grid"] in cycles(root)
    assert not direction_errors(root)  # same package: direction is fine, the cycle is not


def test_old_module_paths_still_import_with_a_deprecation_warning():
    import importlib
    import subprocess
    import sys

    # a fresh interpreter: the old names must not be loaded twice (one class object, the new module's)
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "import headlens.models.hf.bridge as new\n"
        "try:\n"
        "    from headlens.backends.bridge import BridgeModel\n"
        "except DeprecationWarning as w:\n"
        "    print(w)\n"
        "warnings.simplefilter('ignore')\n"
        "from headlens.backends.bridge import BridgeModel\n"
        "from headlens.scan import scan\n"
        "from headlens.zoo.recipes import get_recipe\n"
        "from headlens.probes import random_tokens\n"
        "import headlens.scoring.scan, headlens.training.recipes, headlens.probes.generated\n"
        "assert BridgeModel is new.BridgeModel and scan is headlens.scoring.scan.scan\n"
        "assert get_recipe is headlens.training.recipes.get_recipe\n"
        "assert random_tokens is headlens.probes.generated.random_tokens\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent)
    assert out.returncode == 0, out.stderr
    assert "headlens.backends moved to headlens.models.hf" in out.stdout
    assert importlib.import_module("headlens.models.gpt")  # the new paths import without a warning
