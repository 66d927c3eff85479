"""Moving around the dashboard in a real browser (chromium via Playwright, as tests/app/test_browser.py) leaves
the server's terminal clean, and what it draws fits: "Open the head page" switches the view without
Streamlit's session-state warning (a stack trace in the terminal on every click), the grid's title is
drawn whole inside its chart, and no table shows a column that is empty for every row."""

from __future__ import annotations

import pytest
from browser_tools import ARTIFACTS

from tests.app.test_browser import click_and_wait, dashboard_page, no_exception, wait_idle
from tests.app.test_browser_head import click_head

pytestmark = pytest.mark.browser

REF, HEAD = "induction-2l", "L1H1"
TROUBLE = ("Traceback", "Stack (most recent call last)", "Session State API", "Error")


def title_overflow(page) -> list[str]:
    """The grid's title lines that reach past its chart's edge (plotly titles do not wrap), with their widths."""
    return page.locator("[data-testid=stPlotlyChart]").first.evaluate(
        """chart => {
            const svg = chart.querySelector('svg.main-svg').getBoundingClientRect();
            return Array.from(chart.querySelectorAll('.gtitle, .gtitle tspan')).map(t => {
                const r = t.getBoundingClientRect();
                return (r.left < svg.left - 1 || r.right > svg.right + 1)
                    ? `${t.textContent} (${Math.round(r.left)}..${Math.round(r.right)} of ${Math.round(svg.left)}..${Math.round(svg.right)})`
                    : null;
            }).filter(x => x);
        }""")


def test_opening_the_head_page_logs_nothing_and_the_grid_title_fits():
    with dashboard_page(REF, width=1100, height=2000, failure="navigation_failure") as page:  # a laptop's width
        assert title_overflow(page) == []
        title = page.locator("[data-testid=stPlotlyChart] .gtitle").first.text_content()
        assert "labels" in title and "click a square" in title, title
        page.screenshot(path=str(ARTIFACTS / "dashboard_grid_title.png"))
        if HEAD in page.locator("[data-testid=stMultiSelect]").first.inner_text():
            click_head(page, "L0H0")  # a click on the selected square would not select it anew
        click_head(page, HEAD)
        page.get_by_role("button", name=f"Open the head page of {HEAD}").click()
        page.get_by_text(f"{HEAD} of {REF}").first.wait_for(state="visible", timeout=180_000)
        wait_idle(page, 180_000)
        no_exception(page)
        # and back: the switch keeps working (the button shows again off the Head view)
        click_and_wait(page, page.locator("[data-testid=stButtonGroup] button", has_text="Patterns").first,
                       f"Open the head page of {HEAD}")
        no_exception(page)
    log = (ARTIFACTS / "browser_server.log").read_text()
    assert not [w for w in TROUBLE if w in log], log[-4000:]
