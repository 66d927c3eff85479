"""The static atlas opens in a real chromium from a file:// URL: the grid, a head page, its exemplars."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headlens.atlas.build import build_atlas
from headlens.atlas.exemplars import AtlasConfig
from headlens.atlas.site import write_site
from tests.atlas.planted import planted_gpt, repeat_windows
from tests.browser_tools import ARTIFACTS, CHROMIUM_ARGS, chromium

pytestmark = pytest.mark.browser


@contextlib.contextmanager
def _opened(index: Path, screenshot: str) -> Iterator[Any]:
    """``index`` open from disk in chromium: the page, screenshotted into the artifacts as ``screenshot`` at the end."""
    from playwright.sync_api import sync_playwright

    path = chromium()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(index.resolve().as_uri())
            yield page
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / screenshot), full_page=True)
        finally:
            browser.close()


def _open_head(page: Any, head: str, where: str = "table.grid") -> None:
    """Click ``head``'s link in the grid (or ``where``: ``svg.scatter``, the index's scatter) and wait for its page."""
    page.locator(f"{where} a[href='heads/{head}.html']").click()
    page.wait_for_load_state()


def _marked_keys(atlas: Any, head: str) -> int:
    """How many exemplars of ``head``'s page have their attended key inside the shown tokens (each is outlined)."""
    layer, h = (int(x) for x in head[1:].split("H"))
    flat = layer * atlas.exemplars.n_heads + h
    return sum(0 <= e.key < len(e.tokens) for kept in atlas.exemplars.top.values() for e in kept[flat])


def test_atlas_opens_from_disk_and_links_to_a_head_page(tmp_path):
    chromium()  # skip (or fail in CI) before building anything
    model = planted_gpt()
    atlas = build_atlas(model, AtlasConfig(k=3, batch_size=8), windows=repeat_windows(model, 16))
    index = write_site(atlas, tmp_path / "atlas")
    with _opened(index, "atlas_head_page.png") as page:
        assert page.get_by_role("heading").first.inner_text().startswith("Atlas of")
        assert page.locator("table.grid td").count() == 4
        _open_head(page, "L1H0")
        assert page.get_by_role("heading", level=1).inner_text() == "L1H0: induction"
        assert "Role: induction" in page.locator("p.description").inner_text()
        assert page.locator(".ex .key").count() == _marked_keys(atlas, "L1H0") >= 12  # 5 rankings x 3


def test_the_smollm2_atlas_opens_from_disk_in_chromium(smollm2, tmp_path):
    """The atlas of a real GQA model (SmolLM2, 30 layers x 9 heads) opens from disk: its grid holds every head, a
    click opens the head's page with its tested description and marked exemplars; the index's scatter holds every
    head too, and a click on a point opens that head's page (inline SVG links: no script)."""
    chromium()  # skip (or fail in CI) before building anything
    atlas = build_atlas(smollm2, AtlasConfig(corpus="prose", n_windows=16, seq_len=64, k=3, batch_size=8),
                        subst_windows=0)  # the pages, not the substitution test (tests/atlas/test_substitute.py)
    index = write_site(atlas, tmp_path / "atlas")
    by = {(d.layer, d.head): d for d in atlas.descriptions}
    with _opened(index, "atlas_smollm2_L16H0.png") as page:
        assert page.get_by_role("heading").first.inner_text() == "Atlas of smollm2"
        assert page.locator("table.grid td").count() == 30 * 9
        _open_head(page, "L16H0")
        assert page.get_by_role("heading", level=1).inner_text() == f"L16H0: {by[(16, 0)].role.replace('_', ' ')}"
        assert page.locator("p.description").inner_text() == by[(16, 0)].text
        assert page.locator(".ex .key").count() == _marked_keys(atlas, "L16H0")
        assert page.locator("svg.offsets rect").count() == 65 and "first token:" in page.locator("svg.offsets").inner_html()
        page.go_back()
        page.wait_for_load_state()
        points = page.locator("svg.scatter a.pt")
        assert points.count() == 30 * 9 and points.first.is_visible()
        # a click on a point opens the head's page: the point drawn last, which no other point can cover (heads
        # with like statistics overlap on the scatter)
        top = points.last.get_attribute("href").removeprefix("heads/").removesuffix(".html")
        layer, head = (int(x) for x in top[1:].split("H"))
        _open_head(page, top, "svg.scatter")
        assert page.get_by_role("heading", level=1).inner_text() == f"{top}: {by[(layer, head)].role.replace('_', ' ')}"
        assert page.url.endswith(f"/heads/{top}.html")
