"""Render the report: one self-contained HTML file (inline plotly.js, no network, every data string escaped)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import plotly.io as pio
from jinja2 import Environment, PackageLoader, select_autoescape
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
        json=json,
        fmt=fmt,
    )


def fmt(value: Any, digits: int = 3) -> str:
    """A number for a table cell; '–' for missing or NaN values."""
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    return f"{value:.{digits}f}"
