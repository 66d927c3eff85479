"""The dashboard's views, one module each; ``headlens/app/page.py`` wires them together."""
