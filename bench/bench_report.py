"""Benchmark: the HTML report's size and its first load in headless Chromium, for one or more report files side by side.

    python bench/bench_report.py reports/index.html [other.html ...] [--loads 5]

For each file: its size in MB and what the bytes are (inline scripts, the thumbnail sprite or PNG data URIs, the
explorer's and the figures' JSON, the rest), then the median over `--loads` fresh loads (alternating between the files,
so a busy machine slows every file alike) of (1) the load event's end after navigation start (parsing, every inline
script, the images) and (2) where the page draws its figures lazily, when those on the first screen (1400 x 1000) are
drawn. Each load is a new page in one Chromium (tests/chromium.py), from file://.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root: tests/ holds the Chromium driver

from tests.chromium import Browser  # noqa: E402


def composition(html: str) -> dict[str, float]:
    """MB of the page's parts: inline scripts (plotly.js and the page's), images (data URIs), figure and explorer JSON."""
    mb = lambda text: len(text.encode()) / 1e6  # noqa: E731
    images = sum(mb(m) for m in re.findall(r"data:image/[a-z]+;base64,[A-Za-z0-9+/=]+", html))
    scripts = re.findall(r"<script(?: [^>]*)?>(.*?)</script>", html, flags=re.S)
    json_specs = sum(mb(s) for s in re.findall(r'<script type="application/json" class="figure-spec"[^>]*>(.*?)</script>', html, flags=re.S))
    explorer = sum(mb(s) for s in re.findall(r'<script type="application/json" id="explorer-data">(.*?)</script>', html, flags=re.S))
    code = sum(mb(s) for s in scripts) - json_specs - explorer
    inline_figures = sum(mb(s) for s in scripts if "Plotly.newPlot" in s and len(s) < 2_000_000)  # the old page drew inline
    return {"total": mb(html), "scripts": code - inline_figures, "images": images, "figures": json_specs + inline_figures,
            "explorer": explorer, "rest": mb(html) - images - (code - inline_figures) - json_specs - inline_figures - explorer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="+", type=Path)
    parser.add_argument("--loads", type=int, default=5)
    args = parser.parse_args()
    for page in args.pages:
        parts = composition(page.read_text(encoding="utf-8"))
        print(f"{page}: {parts['total']:.2f} MB = scripts {parts['scripts']:.2f} + images {parts['images']:.2f} + figures "
              f"{parts['figures']:.2f} + explorer {parts['explorer']:.2f} + rest {parts['rest']:.2f}")
    times: dict[Path, list[tuple[float, float | None]]] = {page: [] for page in args.pages}
    with Browser(width=1400, height=1000) as browser:
        for _ in range(args.loads):
            for page in args.pages:
                load = browser.open(page)
                drawn = browser.js("new Promise(r => setTimeout(() => r(window.cedarFirstDraw ? window.cedarFirstDraw / 1000 : null), 500))")
                times[page].append((load, drawn))
    for page, runs in times.items():
        load = statistics.median(t[0] for t in runs)
        drawn = [t[1] for t in runs if t[1] is not None]
        extra = f", first-screen figures drawn at {statistics.median(drawn):.2f} s" if drawn else ""
        print(f"{page}: load event end {load:.2f} s (median of {len(runs)}; range {min(t[0] for t in runs):.2f}-{max(t[0] for t in runs):.2f}){extra}")


if __name__ == "__main__":
    main()
