"""Docs and code comments say why, not which internal issue: a reader cannot look an issue number up."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHERE = ("README.md", "docs", "headlens", "tests", "benchmarks", "analyses", "examples")
SUFFIXES = {".md", ".py", ".ipynb", ".json", ".toml", ".txt"}
ISSUE = re.compile(r"\bissues? #?\d+", re.I)
# being rewritten on another branch at the time of writing (the atlas); drop an entry once its file is clean
PENDING: set[str] = set()  # files allowed to cite an issue number until they are cleaned


def test_no_internal_issue_numbers_in_docs_or_code():
    found = []
    for top in WHERE:
        base = ROOT / top
        for path in [base] if base.is_file() else sorted(base.rglob("*")):
            rel = str(path.relative_to(ROOT))
            if path.suffix not in SUFFIXES or not path.is_file() or rel in PENDING or "/.ipynb_checkpoints/" in rel:
                continue
            found += [f"{rel}:{n}: {line.strip()[:100]}" for n, line in enumerate(path.read_text(errors="ignore")
                                                                                  .splitlines(), 1)
                      if ISSUE.search(line)]
    assert found == [], "\n".join(found)
