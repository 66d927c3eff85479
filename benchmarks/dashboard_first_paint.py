"""Dashboard start-up against a bare Streamlit + plotly page, the way ``tests/app/test_browser.py`` measures it.

    HEADLENS_CHROMIUM=$(command -v chromium) python benchmarks/dashboard_first_paint.py [--repeats 3] [--model code]
    HEADLENS_CHROMIUM=$(command -v chromium) python benchmarks/dashboard_first_paint.py --model smollm2

Each round (interleaved, so a noisy shared CPU hurts both alike): a bare one-chart page served with the
dashboard's Streamlit flags, waited for until its chart has points and its script has finished; then
``headlens dashboard --model MODEL``, timed from starting the server to (a) the first chart's points (the
scored head grid, drawn from stored scores before torch is imported: the zoo's shipped table, or the one an
earlier start kept on disk; the grid a page opens on is sent as an earlier start kept it, before pandas too),
(b) the whole page finished (model loaded, text box and views drawn), and (c) a text edit to the pattern
redrawn on the new tokens (a language model gets 102 tokens of prose). A model whose scores (or opening grid)
are not kept yet is started once first, untimed in the medians (printed as the first start). Prints the median
of each and the ratio grid / bare (goal <= 1.3; edit -> pattern goal <= 0.5 s, 1 s for 100 tokens of
SmolLM2). No assertions: timings are reported, not tested. The servers' own threads are not capped; the CPU is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "app"), str(ROOT / "tests"), str(ROOT / "benchmarks")]

import test_browser as tb  # noqa: E402  (the browser test's servers and waits, reused as they are)
from prose import LM_EDIT  # noqa: E402  (102 tokens of prose, shared with lesson_lm.py)


def is_lm(ref: str) -> bool:
    from headlens.zoo import ZOO

    return ref not in ZOO and not ref.endswith(".safetensors")


def dashboard_round(browser, ref: str) -> dict[str, float]:
    with tb.dashboard_server(ref) as (proc, started, port):
        url = f"http://127.0.0.1:{port}"
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        tb.wait_healthy(url, proc)
        page.goto(url)
        tb.wait_points(page)
        grid = time.perf_counter() - started
        page.wait_for_selector("[data-testid=stTextArea] textarea", timeout=180_000)
        tb.wait_idle(page, 180_000)
        idle = time.perf_counter() - started
        area = page.locator("[data-testid=stTextArea] textarea").first
        text, mark = (LM_EDIT, "Z") if is_lm(ref) else (tb.EDIT_TEXT, "Q")
        area.fill(text)
        edited = time.perf_counter()
        area.press("Control+Enter")
        page.wait_for_function(
            "(mark) => Array.from(document.querySelectorAll('[data-testid=stPlotlyChart] .xtick text'))"
            ".some(e => e.textContent === mark)", arg=mark, timeout=60_000)
        edit = time.perf_counter() - edited
        page.close()
    return {"grid": grid, "idle": idle, "edit": edit}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="code", help="zoo name or reference (default: the bundled default model)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads of the servers (OMP_NUM_THREADS; default: "
                    "torch's own, one per core). On a shared, oversubscribed CPU 1 can be several times faster")
    args = ap.parse_args()
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    from playwright.sync_api import sync_playwright

    tb.ARTIFACTS.mkdir(exist_ok=True)
    bare, rounds = [], []
    with sync_playwright() as pw, tempfile.TemporaryDirectory() as tmp:
        browser = pw.chromium.launch(executable_path=tb.chromium(), args=tb.CHROMIUM_ARGS)
        if not stored(args.model):
            first = dashboard_round(browser, args.model)
            print(f"first start (scores or grid not kept yet: scanned or drawn from the table, then kept): grid "
                  f"{first['grid']:.2f} s, page done {first['idle']:.2f} s", flush=True)
        for i in range(args.repeats):
            bare.append(tb.time_bare_page(browser, Path(tmp)))
            rounds.append(dashboard_round(browser, args.model))
            print(f"round {i + 1}: bare {bare[-1]:.2f} s, grid {rounds[-1]['grid']:.2f} s, page done "
                  f"{rounds[-1]['idle']:.2f} s, edit -> pattern {rounds[-1]['edit']:.2f} s", flush=True)
        browser.close()
    med = {k: statistics.median(r[k] for r in rounds) for k in ("grid", "idle", "edit")}
    b = statistics.median(bare)
    out = {"model": args.model, "repeats": args.repeats, "bare_page_s": b, "grid_s": med["grid"],
           "grid_vs_bare": med["grid"] / b, "page_done_s": med["idle"], "page_done_vs_bare": med["idle"] / b,
           "edit_to_pattern_s": med["edit"]}
    (tb.ARTIFACTS / "first_paint_timings.json").write_text(json.dumps(out, indent=1))
    goals = (1.3, 1.0) if is_lm(args.model) else (1.3, 0.5)
    print(f"median of {args.repeats}: bare page {b:.2f} s; scored grid {med['grid']:.2f} s = {med['grid'] / b:.2f}x "
          f"(goal <= {goals[0]}); whole page {med['idle']:.2f} s = {med['idle'] / b:.2f}x; edit -> pattern "
          f"{med['edit']:.2f} s (goal <= {goals[1]})")


def stored(ref: str) -> bool:
    """Whether the dashboard's default scan of ``ref`` is stored (shipped, or kept on disk by an earlier start), and
    the grid a page opens on with it (kept by an earlier start: headlens.app.grid_store)."""
    from headlens.app import grid_store
    from headlens.app.helpers import DEFAULT_N_PROMPTS
    from headlens.cli.dashboard import _stored

    placed = ("float32", "cpu")
    return _stored(ref, placed) and grid_store.read(ref, DEFAULT_N_PROMPTS, 0, None, placed) is not None


if __name__ == "__main__":
    main()
