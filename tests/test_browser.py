"""The dashboard in a real browser: Debian's chromium driven by Playwright, app served by ``headlens dashboard``.

Never runs ``playwright install`` (it downloads a browser); it uses the system chromium at
``$HEADLENS_CHROMIUM`` or ``/usr/bin/chromium``. Without it the test is skipped, unless
``HEADLENS_REQUIRE_BROWSER`` is set (CI), where a missing browser is a failure.

It measures, and prints (no timed assertions): the time from starting the server to a fully
drawn head grid on the default model, and from a text edit to the redrawn pattern. The
figures are also written to ``artifacts/browser_timings.json`` next to the screenshots.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import make_gpt

from headlens import save_checkpoint
from headlens.app import MODEL_ENV

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
EDIT_TEXT = "Queue (Q) and Queue [Q]"  # the pattern's tick labels show 'Q' once it is redrawn


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def default_model(tmp_path: Path) -> tuple[str, str]:
    """The bundled default model when its weights are installed, else a tiny checkpoint
    (``HEADLENS_BROWSER_MODEL=REF`` measures another model)."""
    from headlens.zoo import DEFAULT_MODEL, available

    if os.environ.get("HEADLENS_BROWSER_MODEL"):
        return os.environ["HEADLENS_BROWSER_MODEL"], os.environ["HEADLENS_BROWSER_MODEL"]
    if DEFAULT_MODEL in available():
        return DEFAULT_MODEL, DEFAULT_MODEL
    path = save_checkpoint(make_gpt(n_ctx=128), tmp_path / "tiny.safetensors")
    return str(path), f"tiny stand-in ({DEFAULT_MODEL!r} not installed)"


@contextlib.contextmanager
def dashboard_server(ref: str, port: int) -> Iterator[tuple[subprocess.Popen, float]]:
    """``headlens dashboard --model REF --port P`` in its own process group; yields it and its start time."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.pop(MODEL_ENV, None)
    log = open(ARTIFACTS / "browser_server.log", "w")  # closed in finally
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "headlens", "dashboard", "--model", ref, "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc, started
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"dashboard exited with {proc.returncode}: "
                                 f"{(ARTIFACTS / 'browser_server.log').read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                return
        time.sleep(0.1)
    raise AssertionError(f"no /_stcore/health answer within {timeout} s")


def wait_idle(page, timeout_ms: int = 60_000) -> None:
    """Wait until Streamlit has finished running the script."""
    page.wait_for_function(
        "() => document.querySelector('[data-testid=stApp]')?.getAttribute('data-test-script-state')"
        " === 'notRunning'", timeout=timeout_ms)


def titles(page) -> list[str]:
    """Titles of the plotly figures on the page (SVG text, so textContent, not innerText)."""
    return page.locator(".gtitle").evaluate_all("els => els.map(e => e.textContent)")


def test_dashboard_in_chromium(tmp_path):
    executable = chromium()
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    ref, model_label = default_model(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    timings: dict[str, float | str] = {"model": model_label}
    with dashboard_server(ref, port) as (proc, started), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            wait_healthy(url, proc)
            timings["server_start_to_health_s"] = time.perf_counter() - started
            page.goto(url)
            grid = page.locator("[data-testid=stPlotlyChart]").first
            points = grid.locator(".scatterlayer .point")
            page.wait_for_function(
                "() => { const p = document.querySelector('[data-testid=stPlotlyChart] .scatterlayer');"
                " return p && p.querySelectorAll('.point').length > 0; }", timeout=90_000)
            wait_idle(page, 90_000)
            timings["server_start_to_grid_s"] = time.perf_counter() - started
            n_points = points.count()
            assert n_points >= 4
            assert page.locator("[data-testid=stException]").count() == 0
            page.screenshot(path=str(ARTIFACTS / "dashboard_grid.png"), full_page=True)

            # click a head that is not selected yet: it becomes the selection and its pattern is drawn
            texts = titles(page)
            names = grid.locator(".js-plotly-plot").evaluate("el => el.data[0].customdata.map(c => c[2])")
            already = page.locator("[data-testid=stMultiSelect]").first.inner_text()
            target = max(i for i, name in enumerate(names) if name not in already)
            box = points.nth(target).bounding_box()
            assert box is not None
            page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            multiselect = page.locator("[data-testid=stMultiSelect]").first
            page.wait_for_function(
                "(before) => { const t = Array.from(document.querySelectorAll('.gtitle')).map(e => e.textContent);"
                " return t.some(s => s.includes('attention on your text') && !before.includes(s)); }",
                arg=texts, timeout=30_000)
            wait_idle(page)
            (clicked,) = [t.split()[0] for t in titles(page) if "attention on your text" in t]
            assert clicked == names[target] and clicked in multiselect.inner_text()
            assert page.locator("[data-testid=stException]").count() == 0

            # edit the text: the pattern is redrawn on the new tokens
            area = page.locator("[data-testid=stTextArea] textarea").first
            area.fill(EDIT_TEXT)
            edited = time.perf_counter()
            area.press("Control+Enter")
            page.wait_for_function(
                "() => Array.from(document.querySelectorAll('[data-testid=stPlotlyChart] .xtick text'))"
                ".some(e => e.textContent === 'Q')", timeout=30_000)
            timings["text_edit_to_pattern_s"] = time.perf_counter() - edited
            wait_idle(page)
            assert page.locator("[data-testid=stException]").count() == 0
            page.screenshot(path=str(ARTIFACTS / "dashboard_pattern.png"), full_page=True)

            # exports: the scores as CSV, a figure as a standalone HTML page
            with page.expect_download() as csv_download:
                page.get_by_role("button", name="Download scores (CSV)").click()
            header = Path(csv_download.value.path()).read_text().splitlines()[0]
            assert header.startswith("model,layer,head,kv_head,detector,score,ci_low,ci_high")
            with page.expect_download() as html_download:
                page.get_by_role("button", name="Download figure (HTML)").first.click()
            exported = Path(html_download.value.path()).read_text()
            assert "<html>" in exported[:200] and "plotly" in exported.lower()
            assert page.locator("[data-testid=stException]").count() == 0
        except Exception:
            # leave evidence for a failure seen only in CI: what the page showed, and what it said
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "dashboard_failure.png"), full_page=True)
                (ARTIFACTS / "dashboard_failure.txt").write_text(page.locator("body").inner_text())
            raise
        finally:
            browser.close()
    (ARTIFACTS / "browser_timings.json").write_text(json.dumps(timings, indent=1))
    print("\n" + "\n".join(f"browser timing: {k} = {v:.2f}" if isinstance(v, float) else f"browser model: {v}"
                           for k, v in timings.items()))
