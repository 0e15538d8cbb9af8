"""The self-contained HTML report: runs chosen and tables built from the records (`tables.py`), the headline and its
sentences (`headline.py`), the terms (`glossary.py`), figures (`figures.py`), the thumbnail sprite (`thumbnails.py`) and
the page (`render.py`, templates/, assets/)."""
