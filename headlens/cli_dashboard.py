"""``headlens dashboard``: serve the Streamlit dashboard on 127.0.0.1.

The page is ``headlens/apps/dashboard_app.py``, shipped inside the package, so this works
after a plain (non-editable) ``pip install``. It runs as ``python -m streamlit run`` in a
child process; the first model is handed over in ``HEADLENS_DASHBOARD_MODEL``.
"""

from __future__ import annotations

import typer

HOST = "127.0.0.1"


def _check_reference(ref: str) -> None:
    """Refuse a model reference that cannot possibly load, before starting a server for it."""
    from pathlib import Path

    from headlens.errors import ModelReferenceError
    from headlens.loading import describe_references
    from headlens.zoo import ZOO

    if ref in ZOO or ref == "minilm":
        return
    target = Path(ref[3:] if ref.startswith("hf:") else ref).expanduser()
    if not target.exists():
        raise ModelReferenceError(f"unknown model reference {ref!r}; expected {describe_references()}")


def _check_port(port: int) -> None:
    import socket

    from headlens.errors import OutputError

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            raise OutputError(f"port {port} on {HOST} is in use; pick another with --port") from None


def streamlit_command(port: int) -> list[str]:
    """The command line that serves the dashboard on ``HOST:port``."""
    import sys

    from headlens.apps import dashboard_script

    return [
        sys.executable, "-m", "streamlit", "run", str(dashboard_script()),
        "--server.address", HOST, "--server.port", str(port), "--server.headless", "true",
        "--server.fileWatcherType", "none", "--browser.gatherUsageStats", "false",
        "--global.developmentMode", "false",
    ]


def register(app: typer.Typer) -> None:
    @app.command("dashboard")
    def dashboard(
        model: str = typer.Option(None, "--model", "-m", help="Model shown first: zoo name, path.safetensors, "
                                  "hf:<dir> or minilm (default: the bundled default model)."),
        port: int = typer.Option(8501, "--port", "-p", min=1, max=65535, help="Port on 127.0.0.1."),
    ) -> None:
        """Open the web dashboard on http://127.0.0.1:PORT (Ctrl+C stops it)."""
        import os
        import subprocess

        from headlens.apps import MODEL_ENV

        if model:
            _check_reference(model.strip())
        _check_port(port)
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        if model:
            env[MODEL_ENV] = model.strip()
        typer.echo(f"headlens dashboard on http://{HOST}:{port}  (Ctrl+C to stop)", err=True)
        try:
            code = subprocess.call(streamlit_command(port), env=env)
        except KeyboardInterrupt:
            code = 0
        raise typer.Exit(code)
