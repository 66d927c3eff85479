"""The examples of README.md and docs/*.md, read from the pages as a reader sees them.

An *example* is a ```python block, or one ``headlens ...`` command line of any other fenced block (``$ ``
prompts, ``pip install ... && headlens ...`` set-up lines, ``torchrun ... -m headlens ...`` and ``\\``
continuations included); a ```text block is printed output, where only ``$ headlens`` lines are commands. ``tests/test_docs_examples.py`` runs them; this module only reads them.

A page says what an example needs in an HTML comment on the lines just before its block, visible in the
Markdown source and not on the rendered page:

    <!-- example: skip (downloads EleutherAI/pythia-160m) -->               the whole block
    <!-- example: skip "headlens dashboard" (serves until stopped) -->      the lines that contain the text
    <!-- example: slow "--model smollm2 --confirm" (about 3 minutes) -->   run only with --runslow

``skip`` is never run by the test (it is counted and reported); ``slow`` runs with ``--runslow``. A
``$ headlens ...`` line followed by output in the same block is checked against that output.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
MARKER = re.compile(r'<!--\s*example:\s*(skip|slow)\s*(?:"([^"]+)")?\s*\((.*?)\)\s*-->')
HEADLENS = re.compile(r"(?:^|&&\s*|-m\s+)(headlens\s.*|headlens$)")


@dataclass(frozen=True)
class Example:
    """One runnable example: where it is, what it is, and what its page says it needs."""

    page: str  # relative to the repository root
    line: int  # of its fence (python) or of the command itself
    kind: str  # "python" or "command"
    code: str  # the block's source, or the command line from "headlens" on
    mark: str = ""  # "", "skip" or "slow"
    reason: str = ""  # why, as the marker says
    expected: str = ""  # output shown after a "$ headlens" line, if any
    launcher: str = ""  # what ran headlens on the page's line ("torchrun ..."), if not the shell

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def argv(self) -> list[str]:
        """The command's arguments after ``headlens`` (trailing ``# comments`` dropped)."""
        return shlex.split(self.code, comments=True)[1:]


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _markers(text: str, fence_start: int) -> list[tuple[str, str, str]]:
    """(mark, text to match or "", reason) of the comments on the lines just before a fence."""
    lines = text[:fence_start].splitlines()
    found = []
    while lines and MARKER.search(lines[-1]):
        mark, match, reason = MARKER.search(lines[-1]).groups()
        found.append((mark, match or "", reason))
        lines.pop()
    return found


def _logical_lines(body: str) -> list[tuple[int, str]]:
    """(offset of first line, line) with ``\\`` continuations joined."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for i, raw in enumerate(body.splitlines()):
        if not pending:
            start = i
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        out.append((start, pending + raw))
        pending = ""
    return out


def _commands(page: str, first_line: int, body: str, marks: list[tuple[str, str, str]],
              prompts_only: bool = False) -> list[Example]:
    lines = _logical_lines(body)
    found = []
    for k, (offset, line) in enumerate(lines):
        shown = line.strip()
        prompt = shown.startswith("$ ")
        found_cmd = HEADLENS.search(shown.removeprefix("$ "))
        if not found_cmd or (prompts_only and not prompt):  # a ```text block is output: "headlens ..." there is prose
            continue
        code = found_cmd.group(1)
        launcher = shown[: found_cmd.start(1)].removeprefix("$ ").strip()
        launcher = "" if launcher.startswith("pip ") or not launcher else launcher
        expected = ""
        if prompt:  # the lines after a "$" command, up to the next one, are its output
            rest = [text for _, text in lines[k + 1:]]
            stop = next((j for j, text in enumerate(rest) if text.startswith("$ ")), len(rest))
            expected = "\n".join(rest[:stop]).strip()
        mark, reason = next(((m, r) for m, match, r in marks if not match or match in line), ("", ""))
        found.append(Example(page, first_line + 1 + offset, "command", code, mark, reason, expected, launcher))
    return found


def examples(path: Path) -> list[Example]:
    """Every example of one page, in page order."""
    text = path.read_text()
    page = str(path.relative_to(ROOT))
    found: list[Example] = []
    for fence in FENCE.finditer(text):
        lang, body = fence.group(1), fence.group(2)
        line = text.count("\n", 0, fence.start()) + 1
        marks = _markers(text, fence.start())
        if lang == "python":
            mark, _, reason = next((m for m in marks if not m[1]), ("", "", ""))
            found.append(Example(page, line, "python", body, mark, reason))
        else:
            found.extend(_commands(page, line, body, marks, prompts_only=lang == "text"))
    return found


def all_examples() -> list[Example]:
    return [example for path in pages() for example in examples(path)]


def summary() -> str:
    """How many examples each page has, and how many of them run in CI, run with --runslow, or are skipped;
    then each one CI does not run, with its marker's reason."""
    from collections import Counter

    counts = Counter((e.page, e.mark or "run") for e in all_examples())
    lines = [f"{'page':22} {'run':>4} {'slow':>5} {'skip':>5}"]
    for page in sorted({page for page, _ in counts}):
        lines.append(f"{page:22} {counts[page, 'run']:4} {counts[page, 'slow']:5} {counts[page, 'skip']:5}")
    total = Counter(mark for (_, mark), n in counts.items() for _ in range(n))
    lines.append(f"{'all':22} {total['run']:4} {total['slow']:5} {total['skip']:5}")
    held = [e for e in all_examples() if e.mark]  # what CI does not run, and why (the page's marker)
    if held:
        lines += ["", "not run in CI:"]
        lines += [f"{e.mark:4} {e.where}: {e.code.split('#')[0].strip()[:90]}\n     {e.reason}" for e in held]
    return "\n".join(lines)


if __name__ == "__main__":  # python -m tests.docs_examples
    print(summary())
