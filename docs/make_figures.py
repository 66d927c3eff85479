"""Regenerate every number and printout the docs quote, in place, from deterministic runs.

    python docs/make_figures.py                  # every figure (SmolLM2's take minutes: run under flock)
    python docs/make_figures.py --cheap          # the zoo's figures only (seconds; what CI checks)
    python docs/make_figures.py --only classify-smollm2 --check   # exit 1 and name what is stale

A page holds a figure between two HTML comments, visible in the Markdown source and not on the page:

    <!-- figure: readme-induction-2l -->
    ...generated text, never edited by hand...
    <!-- /figure -->

Each name is a function below that returns the text (a paragraph, a sentence, a ```text printout of a
``headlens`` command run in-process). The runs are deterministic: the zoo's weights, SmolLM2's GGUF, the
commands' fixed default seeds. Times are figures too (``time-*``), quoted from the record that
``python benchmarks/timings.py`` measures and writes (``benchmarks/results/timings.json``), each with the
machine and the command that measured it. ``tests/test_docs_figures.py`` fails when a cheap figure in a page
differs from what this script produces, and when a page quotes a time more than 2x off the record.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- figure: ([\w.-]+) -->\n)(.*?)(<!-- /figure -->)", re.S)
WIDTH = 105  # the pages' line length


@dataclass(frozen=True)
class Figure:
    """One generated piece of a page: ``slow`` ones load SmolLM2 (minutes on 2 cores)."""

    make: Callable[[], str]
    slow: bool
    timed: bool = False  # a benchmark's printout: times differ run to run, so no test calls it stale


FIGURES: dict[str, Figure] = {}


def figure(name: str, slow: bool = False, timed: bool = False) -> Callable[[Callable[[], str]], Callable[[], str]]:
    def register(make: Callable[[], str]) -> Callable[[], str]:
        FIGURES[name] = Figure(functools.cache(make), slow, timed)
        return make
    return register


def block_names(text: str) -> list[str]:  # read by tests/test_docs_figures.py
    """The figure names a page's text holds, in order."""
    return [match.group(2) for match in BLOCK.finditer(text)]


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def paragraph(text: str) -> str:
    """``text`` wrapped at the pages' width; a signed number never starts a line (Markdown: a list item)."""
    glued = re.sub(r" (?=[+-]\d)", "\0", " ".join(text.split()))
    return textwrap.fill(glued, WIDTH, break_on_hyphens=False).replace("\0", " ") + "\n"


@functools.cache
def cli(*argv: str) -> str:
    """stdout of ``headlens ARGV`` run in-process, as a log sees it (not a terminal: nothing is cut)."""
    from typer.testing import CliRunner

    from headlens.cli import app

    result = CliRunner().invoke(app, list(argv), env={"NO_COLOR": "1"})
    if result.exit_code != 0:
        raise SystemExit(f"headlens {' '.join(argv)} exited {result.exit_code}: {result.stderr.strip()[-500:]}")
    return result.stdout


def fenced(text: str) -> str:
    """``text`` as a ```text block, without the padding rich puts at the ends of lines."""
    return "```text\n" + "\n".join(line.rstrip() for line in text.rstrip().splitlines()) + "\n```\n"



def _score(table, head: str, detector: str) -> str:
    layer, h = (int(x) for x in head[1:].split("H"))
    row = table[(table["layer"] == layer) & (table["head"] == h) & (table["detector"] == detector)].iloc[0]
    return f"{row.score:.3f}", f"[{row.ci_low:.3f}, {row.ci_high:.3f}]", f"{row.lift:.1f}×"


@functools.cache
def _sweep(model_name: str, groups: tuple[str, ...], method: str, n_prompts: int | None = None):
    import headlens

    model = headlens.load(model_name)
    extra = {} if n_prompts is None else {"n_prompts": n_prompts}
    return headlens.sweep(model, groups=list(groups), method=method, metrics=["repeated_loss"], **extra)


@figure("readme-induction-2l")
def readme_induction_2l() -> str:
    """README: what classify and a mean ablation find in the bundled induction-2l (defaults of both)."""
    import headlens

    table = headlens.classify(headlens.load("induction-2l"))
    pt, ind = _score(table, "L0H0", "previous_token"), _score(table, "L1H1", "induction")
    row = _sweep("induction-2l", ("L1H1",), "mean").iloc[0]
    return paragraph(
        f"On the bundled `induction-2l` (two attention-only layers trained on repeated random segments) the "
        f"classification finds the classic circuit: L0H0 attends to the previous token ({pt[0]}, 95 % CI "
        f"{pt[1]}, {pt[2].removesuffix('×')}× its uniform baseline) and L1H1 is an induction head ({ind[0]} "
        f"{ind[1]}, {ind[2]}). Mean-ablating L1H1 takes the loss on the repeated half of a sequence from "
        f"{row.clean:.2f} to {row.ablated:.2f} nats ({row.delta:+.2f} [{row.ci_low:+.2f}, {row.ci_high:+.2f}]); "
        f"random heads of the same layer cost {row.control_delta:+.3f}.")


SMOLLM2_INDUCTION = ("L18H6,L17H4,L17H3,L17H5",)


@figure("smollm2-induction-ablation", slow=True)
def smollm2_induction_ablation() -> str:
    """docs/real-models.md: zero-ablating SmolLM2's four induction heads (8 prompts) against random heads."""
    row = _sweep("smollm2", SMOLLM2_INDUCTION, "zero", 8).iloc[0]
    return paragraph(
        f"- `headlens ablate --model smollm2 --heads {SMOLLM2_INDUCTION[0]} --method zero --n-prompts 8`: the "
        f"loss on the repeated half rises from {row.clean:.2f} to {row.ablated:.2f} nats, {row.delta:+.2f} "
        f"[{row.ci_low:.2f}, {row.ci_high:.2f}], against {row.control_delta:+.2f} for random heads of the same "
        f"layers.").rstrip().replace("\n", "\n  ") + "\n"


@figure("readme-smollm2-ablation", slow=True)
def readme_smollm2_ablation() -> str:
    """README: the same ablation, rounded as the README's sentence quotes it."""
    row = _sweep("smollm2", SMOLLM2_INDUCTION, "zero", 8).iloc[0]
    return paragraph(f"Ablating the four induction heads (zero, 8 prompts) costs {row.delta:+.1f} nats on repeated "
                     f"text (random heads of their layers {row.control_delta:+.1f}).")


@figure("classify-smollm2", slow=True)
def classify_smollm2() -> str:
    """docs/classify.md, "What it prints": the summary of SmolLM2 at the default settings."""
    return fenced(_confirm_run()[0])  # the summary --confirm prints first is classify's own


@figure("confirm-smollm2", slow=True)
def confirm_smollm2() -> str:
    """docs/classify.md, ``--confirm``: the ablation check of SmolLM2's labelled types."""
    return fenced(_confirm_run()[1])


def _confirm_run() -> tuple[str, str]:
    """SmolLM2's ``classify --confirm`` (one scan for both figures): its summary, then its ablation check."""
    text = cli("classify", "--model", "smollm2", "--confirm")
    split = text.index("ablation check")
    return text[:split], text[split:]


def timing(name: str) -> dict:
    """One entry of the timing record (``benchmarks/timings.py`` measures and writes it)."""
    import json

    return json.loads((ROOT / "benchmarks" / "results" / "timings.json").read_text())[name]


def duration(seconds: float) -> str:
    """A measured time as the pages quote it: ``about 2 min 30 s`` (to 10 s above a minute: never a promise
    finer than one run on a shared machine supports)."""
    from headlens.progress import duration as words

    return "about " + words(seconds if seconds < 60 else 10 * round(seconds / 10))


def measured(name: str) -> str:
    """``about 2 min 30 s wall for `COMMAND` on MACHINE (DATE; STATE)``: a time with what measured it."""
    t = timing(name)
    return (f"{duration(t['seconds'])} wall for `{t['command']}` on {t['machine']} ({t['measured']}; {t['state']}); "
            f"`python benchmarks/timings.py --only {name}` re-measures it")


@figure("time-classify-smollm2")
def time_classify_smollm2() -> str:
    """docs/real-models.md: how long the default classify of SmolLM2 takes."""
    return paragraph(f"Measured: {measured('classify-smollm2')}.")


@figure("time-dashboard-first-start-smollm2")
def time_dashboard_first_start_smollm2() -> str:
    """docs/dashboard.md: how long the first start on SmolLM2 takes until the grid is drawn."""
    return paragraph(f"On SmolLM2 the first start draws the grid after {measured('dashboard-first-start-smollm2')}.")


@figure("limits-smollm2", slow=True, timed=True)
def limits_smollm2() -> str:
    """docs/circuits.md, SmolLM2: ``python benchmarks/limits.py``'s printout (each heavy command against plain
    forwards over the same tokens, one process; minutes)."""
    import subprocess

    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "limits.py")], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if run.returncode:
        raise SystemExit(f"benchmarks/limits.py exited {run.returncode}: {run.stderr.strip()[-500:]}")
    return fenced(run.stdout)


def regenerate(text: str, names: set[str]) -> tuple[str, list[str]]:
    """``text`` with figures ``names`` rewritten, and the names whose text changed."""
    changed: list[str] = []

    def fill(match: re.Match) -> str:
        name = match.group(2)
        if name not in FIGURES:
            raise SystemExit(f"unknown figure {name!r}; known: {', '.join(FIGURES)}")
        if name not in names:
            return match.group(0)
        new = FIGURES[name].make()
        if new != match.group(3):
            changed.append(name)
        return match.group(1) + new + match.group(4)

    return BLOCK.sub(fill, text), changed


def stale(names: set[str], write: bool) -> list[str]:
    """``page: figure`` for each figure that differs from what the code produces (rewritten if ``write``)."""
    for name in sorted(names):  # compute first (minutes for SmolLM2), then read and write the pages at once
        FIGURES[name].make()
    found = []
    for page in pages():
        text = page.read_text()
        new, changed = regenerate(text, names)
        found += [f"{page.relative_to(ROOT)}: {name}" for name in changed]
        if write and new != text:
            page.write_text(new)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cheap", action="store_true", help="only the figures that need no SmolLM2")
    parser.add_argument("--only", nargs="+", choices=sorted(FIGURES), help="these figures")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a figure is stale")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    names = set(args.only or FIGURES)
    if args.cheap:
        names = {name for name in names if not FIGURES[name].slow}
    found = stale(names, write=not args.check)
    for line in found:
        print(("stale: " if args.check else "rewrote: ") + line)
    return 1 if found and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
