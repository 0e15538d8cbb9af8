"""Render the report: one self-contained HTML file (inline plotly.js, no network, every data string escaped)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import plotly.io as pio
from jinja2 import Environment, PackageLoader, Undefined, select_autoescape
from markupsafe import Markup
from plotly.offline import get_plotlyjs


@dataclass
class ReportData:
    """Everything the page shows, already computed by earlier stages."""

    title: str
    code_version: str
    params_yaml: str
    dataset: dict[str, Any]
    encoder: dict[str, Any]
    runs: list[dict[str, Any]]
    planted: list[dict[str, Any]] = field(default_factory=list)
    pairs: list[dict[str, Any]] = field(default_factory=list)  # example intervention pairs (data-URI images)
    figures: dict[str, Any] = field(default_factory=dict)  # name -> plotly Figure
    # explanations (pipeline.explanations): section 4 latents and pairs, section 5 examples and rates
    latent_browser: list[dict[str, Any]] = field(default_factory=list)  # `latent_browser(...)`: per method, its best run
    examples: list[dict[str, Any]] = field(default_factory=list)  # `example_table(...)`
    rates: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # `rates_table(...)`: kind -> one row per run
    images: dict[str, str] = field(default_factory=dict)  # thumbnail key ("r12": dataset row, "p3b"/"p3a": pair) -> PNG data URI
    separation: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # kind -> `tables.separation(...)`
    family_separation: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # kind -> `tables.family_separation(...)`
    conventions: list[dict[str, Any]] = field(default_factory=list)  # `tables.conventions(...)`


#: what a thumbnail key and its data URI may contain: they are written into a <style> block, where HTML
#: escaping does not apply, so anything else is refused rather than escaped
_IMAGE_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")
_PNG_URI = re.compile(r"data:image/png;base64,[A-Za-z0-9+/]+=*")


def image_css(images: dict[str, str]) -> Markup:
    """One CSS class per thumbnail (`.im-<key>` with the image as background), so an image shown many
    times (a test image among several latents' top activations) is inlined once."""
    rules = []
    for key, uri in images.items():
        if not isinstance(key, str) or not _IMAGE_KEY.fullmatch(key):
            raise ValueError(f"images: thumbnail key {key!r} must be 1-64 letters, digits, '_' or '-'")
        if not isinstance(uri, str) or not _PNG_URI.fullmatch(uri):
            raise ValueError(f"images[{key!r}]: expected a PNG data URI (data:image/png;base64,...)")
        rules.append(f".im-{key}{{background-image:url({uri})}}")
    return Markup("\n".join(rules))


def figure_html(name: str, figure: Any) -> Markup:
    """A div plus the script that draws `figure` into it. The JSON is made safe to inline in a <script>
    (every '<', '>' and '&' escaped), so data strings can never close the script tag."""
    spec = pio.to_json(figure, validate=False)
    spec = spec.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    div_id = "fig-" + "".join(c if c.isalnum() else "-" for c in name)
    return Markup(
        f'<div id="{div_id}" class="figure"></div>\n'
        f"<script>(function(){{var f={spec};Plotly.newPlot('{div_id}',f.data,f.layout,{{responsive:true,displaylogo:false}});}})();</script>"
    )


def render(data: ReportData) -> str:
    env = Environment(loader=PackageLoader("pipeline.report", "templates"), autoescape=select_autoescape(["html"]))
    template = env.get_template("report.html")
    return template.render(
        d=data,
        plotly_js=Markup(get_plotlyjs()),
        figures={name: figure_html(name, fig) for name, fig in data.figures.items()},
        image_css=image_css(data.images),
        json=json,
        fmt=fmt,
        pct=pct,
    )


def fmt(value: Any, digits: int = 3) -> str:
    """A number for a table cell; '–' for missing (None, undefined in the template) or NaN values."""
    if value is None or isinstance(value, Undefined) or (isinstance(value, float) and value != value):
        return "–"
    return f"{value:.{digits}f}"


def pct(value: Any) -> str:
    """A fraction as a percentage for a table cell ("42%"); '–' for missing or NaN values."""
    if value is None or isinstance(value, Undefined) or (isinstance(value, float) and value != value):
        return "–"
    return f"{100 * value:.0f}%"
