"""Griffe extension for the API reference: a docstring's ``>>>`` examples become ``pycon`` code blocks.

Markdown would read ``>>>`` as nested block quotes; the docstrings keep plain doctest lines (they run
under ``pytest --doctest-modules`` style checks and read well in ``help()``), and only the site fences
them.
"""

from __future__ import annotations

from typing import Any

import griffe


def fence(text: str) -> str:
    """Wrap each run of doctest lines (``>>>``/``...`` and the output lines that follow) in a fence."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith(">>>"):
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            block = []
            while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
                block.append(lines[i][len(indent):])
                i += 1
            out += [f"{indent}```pycon", *(indent + b for b in block), f"{indent}```"]
        else:
            out.append(lines[i])
            i += 1
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence(obj.docstring.value)
