"""The dashboard in a real browser: Debian's chromium driven by Playwright, app served by ``headlens dashboard``.

Never runs ``playwright install`` (it downloads a browser); it uses the system chromium at
``$HEADLENS_CHROMIUM`` or ``/usr/bin/chromium``. Without it the test is skipped, unless
``HEADLENS_REQUIRE_BROWSER`` is set (CI), where a missing browser is a failure.

It measures, and prints (no timed assertions): the time from starting the server to the scored head
grid drawn on the default model (``server_start_to_grid_s``: the first plotly chart on the page has drawn
its points; the grid is the first chart, and the placeholder before it has none; the page may still be
running, loading the model for the views under the grid), the same for a bare Streamlit page holding one
plotly chart (served with the same flags and opened the same way, waited for until its chart has points
and its script has finished: the floor any Streamlit app pays), their ratio (target <= 1.3), the time
until the whole page has finished (``server_start_to_idle_s``: model loaded, views drawn), and the time
from a text edit to the redrawn pattern (target <= 0.5 s). The figures are also written to ``artifacts/browser_timings.json`` next to the
screenshots. It also clicks through every step of the Learn view and counts the pattern's
tick labels against its tokens.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_tools import ARTIFACTS, CHROMIUM_ARGS, chromium
from conftest import make_gpt
from smollm2_cache import smollm2_dashboard_cache  # noqa: F401  (the SmolLM2 test's fixture)

from headlens import save_checkpoint
from headlens.app import MODEL_ENV

pytestmark = pytest.mark.browser

EDIT_TEXT = "Queue (Q) and Queue [Q]"  # the pattern's tick labels show 'Q' once it is redrawn


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


BARE_PAGE = """
import plotly.graph_objects as go
import streamlit as st

st.set_page_config(page_title="bare", layout="wide")
st.plotly_chart(go.Figure(go.Scatter(x=[0, 1, 2, 3], y=[0, 1, 0, 1], mode="markers")), key="bare")
"""


@contextlib.contextmanager
def dashboard_server(ref: str) -> Iterator[tuple[subprocess.Popen, float, int]]:
    """``headlens dashboard --model REF --port P`` in its own process group; yields it, its start time and P."""
    with server(lambda port: [sys.executable, "-m", "headlens", "dashboard", "--model", ref, "--port", str(port)]
                ) as running:
        yield running


@contextlib.contextmanager
def dashboard_page(ref: str, width: int = 1400, height: int = 2600, failure: str = "failure") -> Iterator[Any]:
    """Chromium on ``headlens dashboard --model REF``, the page loaded and settled (grid drawn, text box shown,
    script finished); when the block fails, a screenshot and the page's text go to artifacts/``failure``.*."""
    executable = chromium()
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            with dashboard_server(ref) as (proc, _, port):
                url = f"http://127.0.0.1:{port}"
                page = browser.new_page(viewport={"width": width, "height": height})
                try:
                    wait_healthy(url, proc)
                    page.goto(url)
                    wait_points(page, 180_000)
                    page.wait_for_selector("[data-testid=stTextArea] textarea", timeout=180_000)
                    wait_idle(page, 180_000)
                    yield page
                except Exception:
                    with contextlib.suppress(Exception):
                        page.screenshot(path=str(ARTIFACTS / f"{failure}.png"), full_page=True)
                        (ARTIFACTS / f"{failure}.txt").write_text(page.locator("body").inner_text())
                    raise
        finally:
            browser.close()


@contextlib.contextmanager
def bare_server(script: Path) -> Iterator[tuple[subprocess.Popen, float, int]]:
    """A bare Streamlit page, served with the flags ``headlens dashboard`` uses."""
    from headlens.cli.dashboard import streamlit_args

    def cmd(port: int) -> list[str]:
        args = streamlit_args(port)
        args[1] = str(script)  # ``run <script> --server...``
        return [sys.executable, "-m", "streamlit", *args]

    with server(cmd, log_name="bare_server.log") as running:
        yield running


PORT_TAKEN = "is not available"  # what Streamlit prints, before exiting 1, when its port is taken


@contextlib.contextmanager
def server(cmd: Callable[[int], list[str]], log_name: str = "browser_server.log",
           attempts: int = 5) -> Iterator[tuple[subprocess.Popen, float, int]]:
    """``cmd(port)`` in its own process group, its output logged under artifacts/; yields it, its start time
    and the port it serves on.

    A free port found by binding and closing a socket can be taken by someone else before the server
    binds it. So the server's own log decides: it names the address once it has bound it (then ours
    is the process behind that port), or says the port is taken and exits (then another port is tried).
    """
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.pop(MODEL_ENV, None)
    for _ in range(attempts):
        port = free_port()
        log_path = ARTIFACTS / log_name
        log = open(log_path, "w")  # closed in finally
        started = time.perf_counter()
        proc = subprocess.Popen(cmd(port), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            if wait_bound(proc, log_path, port):
                yield proc, started, port
                return
        finally:
            stop(proc)
            log.close()
    raise AssertionError(f"no free port after {attempts} attempts: {log_path.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_bound(proc: subprocess.Popen, log_path: Path, port: int, timeout: float = 120) -> bool:
    """True once the server's log names ``127.0.0.1:port`` (it is listening); False when it exits because
    the port is taken; an AssertionError when it exits for another reason or says nothing in time."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        said = log_path.read_text()
        if f"127.0.0.1:{port}" in said:
            return True
        if proc.poll() is not None:
            if PORT_TAKEN in said:
                return False
            raise AssertionError(f"server exited with {proc.returncode}: {said[-2000:]}")
        time.sleep(0.1)
    raise AssertionError(f"the server did not start listening within {timeout} s")


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


def wait_points(page, timeout_ms: int = 90_000) -> None:
    """Wait until the first plotly chart on the page has drawn its points (the dashboard's grid: first paint)."""
    page.wait_for_function(
        "() => { const p = document.querySelector('[data-testid=stPlotlyChart] .scatterlayer');"
        " return p && p.querySelectorAll('.point').length > 0; }", timeout=timeout_ms)


def wait_chart(page, timeout_ms: int = 90_000) -> None:
    """Wait until the first plotly chart on the page has drawn its points and the script has finished."""
    wait_points(page, timeout_ms)
    wait_idle(page, timeout_ms)


def no_exception(page) -> None:
    assert page.locator("[data-testid=stException]").count() == 0, page.locator("body").inner_text()[:2000]


def time_bare_page(browser, tmp_path: Path) -> float:
    """Seconds from starting a bare one-chart Streamlit page to its drawn chart (the floor)."""
    script = tmp_path / "bare.py"
    script.write_text(BARE_PAGE)
    with bare_server(script) as (proc, started, port):
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        page.goto(f"http://127.0.0.1:{port}")
        wait_chart(page)
        seconds = time.perf_counter() - started
        page.close()
    return seconds


CHART_TICKS = """() => Array.from(document.querySelectorAll('[data-testid=stPlotlyChart]')).map(c => {
  const p = c.querySelector('.js-plotly-plot'), t = c.querySelector('.gtitle');
  return {title: t ? t.textContent : '', x: c.querySelectorAll('.xtick text').length,
          y: c.querySelectorAll('.ytick text').length,
          n: p && p.data && p.data[0] && p.data[0].type === 'heatmap' ? p.data[0].x.length : null}; })"""


# text each view or Learn step writes first: seeing it means the rerun for the click has drawn the new page
VIEW_MARKERS = {"Learn": "Multi-head attention does not give each head its own copy", "Compare": "Compare with"}
STEP_MARKERS = ("Multi-head attention does not give each head its own copy",
                "The classic multi-head bugs crash nothing", "A head layout is invisible in the weights",
                "Trained heads specialise")


def click_and_wait(page, target, marker: str, timeout_ms: int = 180_000) -> None:
    """Click, then wait for the page the click asked for: its marker text shown, and the script finished.

    Event-based: no fixed sleep that could let the old page's idle state pass for the new one."""
    target.click()
    page.get_by_text(marker).first.wait_for(state="visible", timeout=timeout_ms)
    wait_idle(page, timeout_ms)


def click_view(page, view: str) -> None:
    click_and_wait(page, page.locator("[data-testid=stButtonGroup] button", has_text=view).first, VIEW_MARKERS[view])


def test_dashboard_in_chromium(tmp_path):
    executable = chromium()
    from playwright.sync_api import sync_playwright

    import headlens
    from headlens.app.views.learn import STEPS

    ARTIFACTS.mkdir(exist_ok=True)
    ref, model_label = default_model(tmp_path)
    timings: dict[str, float | str] = {"model": model_label}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        timings["bare_page_start_to_chart_s"] = time_bare_page(browser, tmp_path)
        with dashboard_server(ref) as (proc, started, port):
            url = f"http://127.0.0.1:{port}"
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            try:
                wait_healthy(url, proc)
                timings["server_start_to_health_s"] = time.perf_counter() - started
                page.goto(url)
                grid = page.locator("[data-testid=stPlotlyChart]").first
                points = grid.locator(".scatterlayer .point")
                wait_points(page)
                timings["server_start_to_grid_s"] = time.perf_counter() - started
                timings["grid_vs_bare_page"] = timings["server_start_to_grid_s"] / timings["bare_page_start_to_chart_s"]
                page.wait_for_selector("[data-testid=stTextArea] textarea", timeout=180_000)  # the model's views
                wait_idle(page, 180_000)
                timings["server_start_to_idle_s"] = time.perf_counter() - started
                assert points.count() >= 4
                no_exception(page)
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
                no_exception(page)

                # every token of the pattern's window carries a tick label on both axes
                text = page.locator("[data-testid=stTextArea] textarea").first.input_value()
                n_tokens = len(headlens.load(ref).to_str_tokens(text))
                (ticks,) = [c for c in page.evaluate(CHART_TICKS) if "attention on your text" in c["title"]]
                shown = min(n_tokens, 64)
                assert ticks["n"] == ticks["x"] == ticks["y"] == shown, (ticks, n_tokens)
                timings["pattern_tokens"] = f"{ticks['x']} of {n_tokens} tokens labelled on each axis"

                # the token view: hovering a token colours the text by that query's attention row
                token = page.locator(".headlens-token-view .hl-head").first.locator(".hl-tok").nth(3)
                before = page.locator(".headlens-token-view .hl-tok").first.evaluate("e => e.style.background")
                token.hover()
                page.wait_for_function("() => document.querySelector('.headlens-token-view .hl-query')"
                                       ".textContent.startsWith('#3 ')", timeout=10_000)
                after = page.locator(".headlens-token-view .hl-tok").first.evaluate("e => e.style.background")
                assert before != after

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
                no_exception(page)
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
                no_exception(page)

                # the Learn view, every step clicked through
                click_view(page, "Learn")
                assert len(STEP_MARKERS) == len(STEPS)
                for i, (step, marker) in enumerate(zip(STEPS, STEP_MARKERS, strict=True)):
                    click_and_wait(page, page.get_by_text(step, exact=True), marker, 300_000)
                    others = [m for m in STEP_MARKERS if m != marker]
                    assert not any(page.get_by_text(m).count() for m in others), step  # only this step's page
                    no_exception(page)
                    assert page.locator("[data-testid=stAlert]", has_text="Could not").count() == 0
                    page.screenshot(path=str(ARTIFACTS / f"learn_step{i + 1}.png"), full_page=True)
                click_view(page, "Compare")
                no_exception(page)
            except Exception:
                # leave evidence for a failure seen only in CI: what the page showed, and what it said
                with contextlib.suppress(Exception):
                    page.screenshot(path=str(ARTIFACTS / "dashboard_failure.png"), full_page=True)
                    (ARTIFACTS / "dashboard_failure.txt").write_text(page.locator("body").inner_text())
                raise
        browser.close()
    (ARTIFACTS / "browser_timings.json").write_text(json.dumps(timings, indent=1))
    print("\n" + "\n".join(f"browser timing: {k} = {v:.2f}" if isinstance(v, float) else f"browser: {k}: {v}"
                           for k, v in timings.items()))


def test_learn_on_smollm2_in_chromium(smollm2_dashboard_cache, monkeypatch):  # noqa: F811
    """SmolLM2 in a real browser: its grid drawn from the stored scores, then the Learn view's silent-bug step, where
    the clean model continues "The Eiffel Tower is in the city of" with " Paris" and the broken one does not."""
    executable = chromium()
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    monkeypatch.setenv("HEADLENS_CACHE", str(smollm2_dashboard_cache))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        with dashboard_server("smollm2") as (proc, started, port):
            url = f"http://127.0.0.1:{port}"
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            try:
                wait_healthy(url, proc)
                page.goto(url)
                wait_points(page, 180_000)
                grid_s = time.perf_counter() - started
                assert page.locator("[data-testid=stPlotlyChart]").first.locator(".scatterlayer .point").count() == 270
                page.wait_for_selector("[data-testid=stTextArea] textarea", timeout=300_000)
                wait_idle(page, 300_000)
                click_view(page, "Learn")
                click_and_wait(page, page.get_by_text("2 · Silent bugs", exact=True), STEP_MARKERS[1], 300_000)
                said = page.locator(".headlens-continuation").all_inner_texts()
                assert len(said) == 2 and "Paris" in said[0] and "Paris" not in said[1], said
                no_exception(page)
                page.screenshot(path=str(ARTIFACTS / "learn_smollm2_bugs.png"), full_page=True)
            except Exception:
                with contextlib.suppress(Exception):
                    page.screenshot(path=str(ARTIFACTS / "smollm2_failure.png"), full_page=True)
                    (ARTIFACTS / "smollm2_failure.txt").write_text(page.locator("body").inner_text())
                raise
        browser.close()
    print(f"\nbrowser timing: smollm2 server start to a grid from stored scores = {grid_s:.2f} s")
