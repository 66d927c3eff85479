"""Streamlit pages shipped with headlens (``headlens dashboard`` serves ``dashboard_app.py``).

Kept import-light: the CLI reads these two names without importing Streamlit.
"""

from __future__ import annotations

from pathlib import Path

MODEL_ENV = "HEADLENS_DASHBOARD_MODEL"  # `headlens dashboard --model REF` hands the first model over in it


def dashboard_script() -> Path:
    """The dashboard's Streamlit script, inside the installed package."""
    return Path(__file__).resolve().parent / "dashboard_app.py"
