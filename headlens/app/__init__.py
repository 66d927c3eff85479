"""The Streamlit dashboard shipped with headlens (``headlens dashboard`` serves ``page.py``).

Kept import-light: the CLI reads these names without importing Streamlit.
"""

from __future__ import annotations

import threading
from pathlib import Path

# Cleared by `headlens dashboard` while its warm-up thread imports numpy, pandas and plotly, which
# the page shares with it. plotly looks numpy and pandas up in sys.modules without importing them,
# so a page run that draws while pandas is half imported fails ("partially initialized module
# 'pandas' has no attribute 'Series'"). The page waits for it before it draws anything but its first paint (which
# holds SHARED_IMPORT_LOCK instead); set when no warm-up runs.
SHARED_IMPORTS = threading.Event()
SHARED_IMPORTS.set()

# Held while the warm-up imports them, and while a page draws its first paint, which may not import pandas at all
# (a kept grid: headlens.app.grid_store): no half-imported pandas meets the page's plotly.
SHARED_IMPORT_LOCK = threading.Lock()

# Set by the page once it has drawn a model's grid from its stored scores (or found none to draw): for a model
# with stored scores `headlens dashboard`'s warm-up waits for it before importing pandas and torch, whose imports
# would otherwise hold the GIL and a core while the first page runs and the browser draws it (the first paint
# needs neither; the views under the grid do).
FIRST_PAINT = threading.Event()

MODEL_ENV = "HEADLENS_DASHBOARD_MODEL"  # `headlens dashboard --model REF` hands the first model over in it
DTYPE_ENV = "HEADLENS_DASHBOARD_DTYPE"  # ... and --dtype / --device, the sidebar's starting precision and device
DEVICE_ENV = "HEADLENS_DASHBOARD_DEVICE"


def dashboard_script() -> Path:
    """The dashboard's Streamlit script, inside the installed package."""
    return Path(__file__).resolve().parent / "page.py"
