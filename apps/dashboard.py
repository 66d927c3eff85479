"""The headlens dashboard from a source checkout: ``streamlit run apps/dashboard.py``.

The page itself (layout and widgets) lives in ``headlens/app/page.py`` so that it
ships inside the package and ``headlens dashboard`` serves it after a plain ``pip install``;
this entry runs the same page. Pick the first model with ``HEADLENS_DASHBOARD_MODEL=REF``.
"""

from headlens.app.page import run

run()
