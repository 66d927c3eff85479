"""Debian's chromium for the browser tests: where it is, how it is started, where screenshots go.

Never ``playwright install`` (it downloads a browser); the system chromium at ``$HEADLENS_CHROMIUM`` or
``/usr/bin/chromium``. Without it a browser test is skipped, unless ``HEADLENS_REQUIRE_BROWSER`` is set.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def chromium() -> str:
    path = os.environ.get("HEADLENS_CHROMIUM") or "/usr/bin/chromium"
    problem = None
    if not Path(path).is_file():
        problem = f"chromium not found at {path} (apt-get install -y chromium, or set HEADLENS_CHROMIUM)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            problem = "Playwright for Python is not installed (pip install playwright; no browser download needed)"
    if problem:
        if os.environ.get("HEADLENS_REQUIRE_BROWSER"):
            pytest.fail(problem + "; HEADLENS_REQUIRE_BROWSER is set, so the browser test may not skip")
        pytest.skip(problem)
    return path
