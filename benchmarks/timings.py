"""The times the docs quote, measured and recorded in one place: ``benchmarks/results/timings.json``.

    python benchmarks/timings.py                                # re-time every entry and rewrite the record
    python benchmarks/timings.py --only classify-smollm2        # one entry
    python docs/make_figures.py                                 # then the pages quote the new record

Each entry runs one user command in a fresh process, as a user would, and records its wall time with the
command, the machine (CPU, cores, memory) and its state while it ran (the load average before and after, and
the CPU time the command itself used): on a shared machine the wall time is inflated by the other work, so
re-measure on a quiet one before a release. The docs' timing figures (``docs/make_figures.py``, ``time-*``)
quote this record; ``tests/test_docs_figures.py`` fails when a page quotes a time more than 2x off it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "results" / "timings.json"


@dataclass(frozen=True)
class Timing:
    """One quoted time: the command a user types, what is timed, and how (``run(env) -> seconds``); ``fresh``: with
    an empty headlens cache (a first start: nothing converted or scored yet), else the user's own."""

    command: str
    what: str
    run: Callable[[dict[str, str]], float]
    fresh: bool = False


def command_time(argv: list[str]) -> Callable[[dict[str, str]], float]:
    """Wall seconds of ``python -m headlens ARGV`` from its start to its exit."""

    def run(env: dict[str, str]) -> float:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "headlens", *argv], env=env, check=True, capture_output=True, cwd=ROOT)
        return time.perf_counter() - start

    return run


def dashboard_first_start(ref: str) -> Callable[[dict[str, str]], float]:
    """Seconds from starting ``headlens dashboard --model REF`` with nothing kept on disk to its scored head grid
    drawn in chromium (the browser test's server and waits)."""

    def run(env: dict[str, str]) -> float:
        sys.path[:0] = [str(ROOT / "tests" / "app"), str(ROOT / "tests"), str(ROOT)]  # tests/conftest imports tests.*
        os.environ.update(env)
        import test_browser as tb
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=tb.chromium(), args=tb.CHROMIUM_ARGS)
            with tb.dashboard_server(ref) as (proc, started, port):
                url = f"http://127.0.0.1:{port}"
                page = browser.new_page(viewport={"width": 1400, "height": 1800})
                tb.wait_healthy(url, proc)
                page.goto(url)
                tb.wait_points(page, 1_800_000)
                seconds = time.perf_counter() - started
            browser.close()
        return seconds

    return run


TIMINGS = {
    "classify-smollm2": Timing("headlens classify --model smollm2", "classify SmolLM2 at the default settings, "
                               "load to summary", command_time(["classify", "--model", "smollm2"])),
    "dashboard-first-start-smollm2": Timing(
        "headlens dashboard --model smollm2", "the dashboard's first start on SmolLM2 (nothing kept on disk) until "
        "the scored head grid is drawn", dashboard_first_start("smollm2"), fresh=True),
}


def machine() -> str:
    """``2 cores of an Intel(R) Xeon(R) ..., 24 GiB``: what the time was measured on."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        kib = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                   if ln.startswith("MemTotal"))
        memory = f", {kib / 2**20:.0f} GiB"
    except (OSError, StopIteration):
        memory = ""
    return f"{os.cpu_count()} cores of an {model}{memory}"


def measure(name: str) -> dict[str, object]:
    """Time ``name`` once, in a fresh process, and describe the run."""
    timing = TIMINGS[name]
    before = os.getloadavg()[0]
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, **({"HEADLENS_CACHE": cache} if timing.fresh else {}), "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        seconds = timing.run(env)
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    after = os.getloadavg()[0]
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    return {"seconds": round(seconds, 1), "command": timing.command, "what": timing.what, "machine": machine(),
            "state": f"load average {before:.1f} before, {after:.1f} after"
                     + (f"; {cpu:.0f} s of CPU in the command's processes" if cpu > 0 else ""),
            "measured": datetime.date.today().isoformat()}


def read() -> dict[str, dict[str, object]]:
    """The record (read by docs/make_figures.py and tests/test_docs_figures.py)."""
    return json.loads(RECORD.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(TIMINGS), help="these entries (default: all)")
    args = parser.parse_args(argv)
    record = read() if RECORD.exists() else {}
    for name in args.only or sorted(TIMINGS):
        record[name] = measure(name)
        print(f"{name}: {record[name]['seconds']} s ({record[name]['state']})", flush=True)
        RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {RECORD.relative_to(ROOT)}; now run: python docs/make_figures.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
