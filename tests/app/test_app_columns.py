"""No table in the dashboard shows a column that is empty for every row (headless, AppTest): the head page's
scores and the selected heads' table."""

from __future__ import annotations

from tests.app.test_app_head import open_head_page


def empty_columns(at) -> list[tuple[list[str], list[str]]]:
    """(the table's columns, those empty for every row) of each table with such a column."""
    out = []
    for frame in at.dataframe:
        value = frame.value
        empty = [str(c) for c in value.columns if len(value) and not value[c].notna().any()]
        if empty:
            out.append(([str(c) for c in value.columns], empty))
    return out


def test_the_head_page_and_the_detail_table_show_no_empty_column(monkeypatch):
    """A table with the preference columns on no row (a scan whose annotated probes had no distractors): the
    head page and the detail table leave them out instead of three columns of None."""
    from headlens.app import cache

    scored = cache.get_scores

    def with_empty_preferences(*args, **kwargs):
        table = scored(*args, **kwargs).copy()
        return table.assign(preference=None, preference_ci_low=None, preference_ci_high=None)

    monkeypatch.setattr(cache, "get_scores", with_empty_preferences)
    at = open_head_page(monkeypatch, "induction-2l")
    tables = [list(frame.value.columns) for frame in at.dataframe]
    assert sum("detector" in cols and "score" in cols for cols in tables) >= 2, tables  # the page's and the detail
    assert empty_columns(at) == []
