"""``headlens dashboard``: serve the Streamlit dashboard on 127.0.0.1.

The page is ``headlens/app/page.py``, shipped inside the package, so this works
after a plain (non-editable) ``pip install``. Streamlit runs in this process (its own
``streamlit run``), so torch is imported once; while the server starts, a background thread
imports torch, loads the first model and scores its heads into the app's caches, so the first
page shows the grid without waiting for a scan. ``import headlens`` does not import torch, so
the server answers before torch has loaded, and the page draws a placeholder figure at once so
that the browser parses plotly while the server scores. A zoo model's grid is drawn from its
shipped scores (or from the scores an earlier start stored on disk: headlens.app.score_store) before torch is
imported at all; the views under it fill in once the model is loaded. The first model is handed over in
``HEADLENS_DASHBOARD_MODEL``.
"""

from __future__ import annotations

import os

import typer

from headlens.cli import options as opt

HOST = "127.0.0.1"


def _check_port(port: int) -> None:
    import socket

    from headlens.errors import OutputError

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # as the server will: a just-stopped dashboard leaves TIME_WAIT sockets that must not block a restart
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            raise OutputError(f"port {port} on {HOST} is in use; pick another with --port") from None


def streamlit_args(port: int) -> list[str]:
    """``streamlit run`` arguments that serve the dashboard on ``HOST:port``."""
    from headlens.app import dashboard_script

    return [
        "run", str(dashboard_script()),
        "--server.address", HOST, "--server.port", str(port), "--server.headless", "true",
        "--server.fileWatcherType", "none", "--browser.gatherUsageStats", "false",
        "--global.developmentMode", "false", "--client.toolbarMode", "minimal",
    ]


def import_shared() -> None:
    """Import what the page shares with the warm-up thread, then let the page draw (see ``SHARED_IMPORTS``)."""
    import contextlib

    from headlens.app import SHARED_IMPORT_LOCK, SHARED_IMPORTS

    try:
        with SHARED_IMPORT_LOCK, contextlib.suppress(ImportError):  # not while a page draws without them
            import numpy  # noqa: F401
            import pandas  # noqa: F401
            import plotly.graph_objects  # noqa: F401  (the page's first run draws with it)
    finally:
        SHARED_IMPORTS.set()


FIRST_PAINT_WAIT_S = 10.0  # how long the warm-up waits for a page to draw stored scores before importing the rest
# ... and then how long it lets the server send what the page queued: torch's and transformers' imports hold the GIL
# for seconds, and the server thread starved with them (SmolLM2's stored grid: 1.81x a bare page without it, 1.62x
# with 1.5 s, 1.60x with 3 s; benchmarks/dashboard_first_paint.py --model smollm2)
FIRST_PAINT_GRACE_S = 1.5


def _stored(ref: str, placed: tuple[str, str]) -> bool:
    """Whether the scores of the dashboard's default scan of ``ref`` are stored (a zoo model's shipped table, or
    one an earlier start kept on disk), so the page draws the grid without torch."""
    from headlens.app import helpers as hd
    from headlens.app import score_store
    from headlens.zoo import scores

    try:
        if placed[0] == "float32" and scores.load(ref, hd.DEFAULT_N_PROMPTS, 0) is not None:  # no pandas
            return True
        return score_store.stamp(ref, hd.DEFAULT_N_PROMPTS, 0, None, placed) > 0
    except (OSError, ValueError, KeyError):
        return False


def _first_model() -> tuple[str | None, tuple[str, str]]:
    """The model the page opens on (None for the custom entry, or when the picker fails) and its placement."""
    from headlens.app import DEVICE_ENV, DTYPE_ENV
    from headlens.app import helpers as hd

    placed = (os.environ.get(DTYPE_ENV) or "float32", os.environ.get(DEVICE_ENV) or "cpu")
    try:
        ref = hd.initial_model() or hd.model_choices()[0]
    except Exception:  # the page reports it itself
        return None, placed
    return (None if ref == hd.CUSTOM_CHOICE else ref), placed


def _warm_up() -> None:
    """Import the heavy modules once Streamlit's runtime exists; then load and score the first model.

    For a model whose scores are stored (shipped with the zoo, or kept on disk by an earlier start) the page draws
    the grid first, without torch and, when an earlier start kept that grid, without pandas
    (:mod:`headlens.app.grid_store`): the warm-up waits (at most ``FIRST_PAINT_WAIT_S``) until it has
    (``headlens.app.FIRST_PAINT``), and ``FIRST_PAINT_GRACE_S`` more while the server sends it and the browser
    parses plotly and draws it: imports hold the GIL and a core (pandas right after the first paint: SmolLM2's
    grid 1.40x a bare page instead of 1.30x). Otherwise it imports pandas and plotly at once, beside the browser
    loading the page. The Streamlit caches wait for the runtime too: ``st.cache_data`` used before it exists
    warns and stores into a throwaway cache.
    """
    import contextlib
    import time

    started = time.monotonic()
    with contextlib.suppress(Exception):
        from streamlit import runtime

        deadline = time.monotonic() + 120
        while not runtime.exists() and time.monotonic() < deadline:  # let the server start first, alone
            time.sleep(0.02)
    ref, placed = _first_model()
    if ref is not None and _stored(ref, placed):  # the page draws the grid first, without pandas or torch
        from headlens.app import FIRST_PAINT

        if FIRST_PAINT.wait(timeout=FIRST_PAINT_WAIT_S):  # then the browser parses plotly and draws it: any
            time.sleep(FIRST_PAINT_GRACE_S)  # import now takes the GIL and a core from the server and the browser
    import_shared()
    if ref is None:
        return
    with contextlib.suppress(Exception):  # the page reports any failure itself
        from streamlit import runtime

        import headlens.models.gpt  # noqa: F401  (torch)

        deadline = time.monotonic() + 120
        while not runtime.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        from headlens.app import cache
        from headlens.cli.progress import LineProgress

        line = LineProgress(f"dashboard: loading {ref}")  # plain lines: Streamlit logs to this terminal too
        line.start_heartbeat()  # the first start scores every head: minutes on a real model, said every ~8 s
        try:
            cache.get_model(ref, placed)
            cache.get_scores(ref, placement=placed, progress=lambda done, total, what: line.update(done, total, what))
        finally:
            line.stop_heartbeat()
        typer.echo(f"headlens dashboard: {ref} loaded and scored in {time.monotonic() - started:.1f} s", err=True)


def register(app: typer.Typer) -> None:
    @app.command("dashboard")
    def dashboard(
        model: str = typer.Option(None, "--model", "-m", help="Model shown first: zoo name, path.safetensors, "
                                  "hf:<dir>, smollm2, gguf:<file> or minilm (default: the bundled default model)."),
        port: int = typer.Option(8501, "--port", min=1, max=65535, help="Port on 127.0.0.1."),
        warm: bool = typer.Option(True, "--warm/--no-warm", help="Score the first model while the server starts."),
        dtype: opt.Dtype = "float32",
        device: opt.Device = "cpu",
    ) -> None:
        """Open the web dashboard on http://127.0.0.1:PORT (Ctrl+C stops it)."""
        import threading

        from streamlit.web import cli as streamlit_cli

        from headlens.app import DEVICE_ENV, DTYPE_ENV, MODEL_ENV, SHARED_IMPORTS
        from headlens.models.placement import dtype_name, resolve_device

        if model:
            from headlens.models.loading import check_reference

            check_reference(model.strip())
            os.environ[MODEL_ENV] = model.strip()
        # refuse a bad or unavailable one before serving, but import no torch for the CPU: imported here, torch
        # held the server's start back by the second or two it takes (the warm-up thread imports it beside)
        device = device.strip().lower()
        if device != "cpu":
            resolve_device(device)
        # canonical names: the sidebar and the warm-up's cache key read them (bf16 is bfloat16 there too)
        os.environ[DTYPE_ENV], os.environ[DEVICE_ENV] = dtype_name(dtype), device
        _check_port(port)
        typer.echo(f"headlens dashboard on http://{HOST}:{port}  (Ctrl+C to stop)", err=True)
        if warm:
            SHARED_IMPORTS.clear()  # until the warm-up has imported them
            threading.Thread(target=_warm_up, name="headlens-warm-up", daemon=True).start()
        streamlit_cli.main(args=streamlit_args(port), prog_name="streamlit")
