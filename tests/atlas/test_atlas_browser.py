"""The static atlas opens in a real chromium from a file:// URL: the grid, a head page, its exemplars."""

from __future__ import annotations

import pytest

from headlens.atlas.build import build_atlas
from headlens.atlas.exemplars import AtlasConfig
from headlens.atlas.site import write_site
from tests.atlas.planted import planted_gpt, repeat_windows
from tests.browser_tools import ARTIFACTS, CHROMIUM_ARGS, chromium

pytestmark = pytest.mark.browser


def test_atlas_opens_from_disk_and_links_to_a_head_page(tmp_path):
    from playwright.sync_api import sync_playwright

    path = chromium()
    model = planted_gpt()
    index = write_site(build_atlas(model, AtlasConfig(k=3, batch_size=8), windows=repeat_windows(model, 16)),
                       tmp_path / "atlas")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(index.resolve().as_uri())
            assert page.get_by_role("heading").first.inner_text().startswith("Atlas of")
            assert page.locator("table.grid td").count() == 4
            page.locator("a[href='heads/L1H0.html']").click()
            page.wait_for_load_state()
            assert page.get_by_role("heading", level=1).inner_text() == "L1H0: induction"
            assert "Role: induction" in page.locator("p.description").inner_text()
            assert page.locator(".ex .key").count() == 12  # one attended key marked per exemplar (4 rankings x 3)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "atlas_head_page.png"), full_page=True)
        finally:
            browser.close()
