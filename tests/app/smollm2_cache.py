"""The dashboard's SmolLM2 tests share one cache: the test run's GGUF conversion (linked, never converted twice) and
a small scan of the lesson's head types stored where the dashboard looks for scores, so that neither the in-process
AppTest nor the browser test's server spends half a minute scoring all 270 heads on every detector.

A module the tests import the fixture from (``from smollm2_cache import smollm2_dashboard_cache``), not a
``conftest.py``: one in tests/app would shadow tests/conftest.py for the modules that import from it. The cache is
built once per test run, whichever module asks first."""

from __future__ import annotations

from pathlib import Path

import pytest

LESSON_TYPES = ("previous_token", "duplicate_token", "induction")  # the specialists the Learn view shows first
SCAN_PROMPTS = 12  # prompts per probe: enough for SmolLM2's known heads to pass the label rule


@pytest.fixture(scope="session")
def smollm2_dashboard_cache(smollm2, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache root for the dashboard on SmolLM2: ``gguf/`` linked to the test run's, and under the dashboard's own
    key for its default scan a scan of :data:`LESSON_TYPES` (the other default detectors marked as not scanned)."""
    if _BUILT:
        return _BUILT[0]
    from headlens.app import helpers as hd
    from headlens.app import score_store
    from headlens.detectors import all_detectors
    from headlens.models.hf.gguf import cache_root

    root = tmp_path_factory.mktemp("dashboard-cache")
    (root / "gguf").symlink_to(cache_root() / "gguf", target_is_directory=True)
    table = hd.compute_scores(smollm2, n_prompts=SCAN_PROMPTS, detectors=LESSON_TYPES)
    others = [n for n, d in all_detectors().items() if d.default and n not in LESSON_TYPES]
    table.attrs["skipped"] = {**table.attrs.get("skipped", {}), **{n: "not scanned in this test" for n in others}}
    mp = pytest.MonkeyPatch()
    mp.setenv("HEADLENS_CACHE", str(root))
    try:
        assert score_store.write("smollm2", table, hd.DEFAULT_N_PROMPTS, 0, None, ("float32", "cpu")) is not None
    finally:
        mp.undo()
    _BUILT.append(root)
    return root


_BUILT: list[Path] = []
