"""The Streamlit dashboard shipped with headlens (``headlens dashboard`` serves ``page.py``).

Kept import-light: the CLI reads these names without importing Streamlit.
"""

from __future__ import annotations

import threading
from pathlib import Path

# Cleared by `headlens dashboard` while its warm-up thread imports numpy, pandas and plotly, which
# the page shares with it. plotly looks numpy and pandas up in sys.modules without importing them,
# so a page run that draws while pandas is half imported fails ("partially initialized module
# 'pandas' has no attribute 'Series'"). The page waits for it before drawing; set when no warm-up runs.
SHARED_IMPORTS = threading.Event()
SHARED_IMPORTS.set()

# Held while the warm-up imports them, and while a page draws its first paint without them (a stored grid: pandas
# is not imported): no half-imported pandas meets the page's plotly (see SHARED_IMPORTS), and the warm-up waits
# for the first paint anyway (FIRST_PAINT).
SHARED_IMPORT_LOCK = threading.Lock()

# Set by the page once it has drawn a zoo model's grid from its shipped scores (or found none to draw):
# `headlens dashboard`'s warm-up waits for it before importing torch, whose import would otherwise hold the
# GIL while the first page runs (the first paint does not need torch; the views under the grid do).
FIRST_PAINT = threading.Event()

MODEL_ENV = "HEADLENS_DASHBOARD_MODEL"  # `headlens dashboard --model REF` hands the first model over in it
DTYPE_ENV = "HEADLENS_DASHBOARD_DTYPE"  # ... and --dtype / --device, the sidebar's starting precision and device
DEVICE_ENV = "HEADLENS_DASHBOARD_DEVICE"


def dashboard_script() -> Path:
    """The dashboard's Streamlit script, inside the installed package."""
    return Path(__file__).resolve().parent / "page.py"
