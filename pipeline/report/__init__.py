"""The self-contained HTML report: figures (`figures.py`) and the page (`render.py`, jinja2 templates)."""
