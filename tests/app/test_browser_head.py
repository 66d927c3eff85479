"""The Head view in a real browser (chromium via Playwright, as tests/app/test_browser.py): click a head in the
grid of the zoo's induction-2l, open its page, and see it named an induction head, its exemplars drawn."""

from __future__ import annotations

import pytest
from browser_tools import ARTIFACTS

from headlens.atlas.views import OFFSET_WIDTH
from tests.app.test_browser import dashboard_page, no_exception, wait_idle

pytestmark = pytest.mark.browser

REF, HEAD = "induction-2l", "L1H1"  # its induction head (headlens/zoo/cards/induction-2l.md)


def click_head(page, name: str) -> None:
    """Click ``name``'s square in the grid (the first chart) and wait for the page to settle."""
    grid = page.locator("[data-testid=stPlotlyChart]").first
    names = grid.locator(".js-plotly-plot").evaluate("el => el.data[0].customdata.map(c => c[2])")
    box = grid.locator(".scatterlayer .point").nth(names.index(name)).bounding_box()
    assert box is not None
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.get_by_role("button", name=f"Open the head page of {name}").wait_for(state="visible", timeout=60_000)
    wait_idle(page)


def test_clicking_a_head_opens_its_page_in_chromium():
    with dashboard_page(REF, failure="head_failure") as page:
        if HEAD in page.locator("[data-testid=stMultiSelect]").first.inner_text():
            click_head(page, "L0H0")  # a click on the selected square would not select it anew
        click_head(page, HEAD)
        page.get_by_role("button", name=f"Open the head page of {HEAD}").click()
        page.get_by_text(f"{HEAD} of {REF}: induction").wait_for(state="visible", timeout=180_000)
        page.locator(".headlens-exemplars").wait_for(state="visible", timeout=180_000)  # the atlas is built
        wait_idle(page, 180_000)
        no_exception(page)
        description = page.locator(".headlens-description").inner_text()
        assert "Role: induction." in description and "r = 0.9" in description, description
        assert page.locator(".headlens-exemplars .ex").count() == 20
        assert page.locator(".headlens-exemplars .ex .key").count() >= 1
        ablated = page.locator("[data-testid=stMetric]", has_text="lm_loss change, L1H1 zeroed")
        ablated.wait_for(state="visible", timeout=180_000)  # it may render after the exemplars
        assert ablated.count() == 1
        profile = page.locator("[data-testid=stImage] img").first  # the offset profile, drawn
        assert profile.is_visible() and profile.evaluate("e => e.naturalWidth") == OFFSET_WIDTH
        assert "Probes: induction" in page.locator(".card").first.inner_text()  # the head card
        page.screenshot(path=str(ARTIFACTS / "dashboard_head.png"), full_page=True)
