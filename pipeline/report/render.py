"""Render the report: one self-contained HTML file. plotly.js's basic bundle (scatter and bar, vendored in assets/) and
the page's own small script are inlined, every thumbnail is a tile of one WebP sprite, every data string is escaped
(HTML by jinja2's autoescape, JSON inside <script> by `script_json`), and a Content-Security-Policy forbids the page any
request: it works from file:// with no network."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import plotly.io as pio
from jinja2 import Environment, PackageLoader, Undefined, select_autoescape
from markupsafe import Markup

from pipeline.report.figures import CONFIG
from pipeline.report.glossary import TERMS

#: the vendored plotly.js bundle: the npm package plotly.js-basic-dist-min (scatter, bar, pie traces), at the version of
#: the full bundle the installed plotly package ships (tests/test_report_render.py checks the major version)
PLOTLY_BUNDLE = "plotly-basic.min.js"


@dataclass
class ReportData:
    """Everything the page shows, already computed by earlier stages."""

    title: str
    provenance: dict[str, Any]  # code_digest, git_commit (or None), device, versions {package: version}, training_time
    params_yaml: str
    dataset: dict[str, Any]
    encoder: dict[str, Any]
    runs: list[dict[str, Any]]
    planted: list[dict[str, Any]] = field(default_factory=list)
    pairs: list[dict[str, Any]] = field(default_factory=list)  # example intervention pairs: kind, family, edit, before / after tiles
    figures: dict[str, Any] = field(default_factory=dict)  # name -> plotly Figure
    headline: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # kind -> `headline.headline(...)`
    sentences: dict[str, list[str]] = field(default_factory=dict)  # kind -> `headline.sentences(...)`
    sanity: dict[str, list[str]] = field(default_factory=dict)  # kind -> `headline.sanity_sentences(...)`
    explorer: dict[str, Any] = field(default_factory=dict)  # `tables.explorer(...)`: every run's latents
    explorer_default: list[str] = field(default_factory=list)  # the runs the explorer opens side by side
    examples: list[dict[str, Any]] = field(default_factory=list)  # `tables.example_table(...)`
    rates: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # `tables.rates_table(...)`: kind -> one row per run
    sprite: str | None = None  # `thumbnails.sprite(...)`: every thumbnail, one WebP data URI
    sprite_columns: int = 1
    tiles: dict[str, int] = field(default_factory=dict)  # thumbnail key ("r12": dataset row, "p3b"/"p3a": pair) -> sprite tile
    separation: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # kind -> `tables.separation(...)`
    family_separation: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # kind -> `tables.family_separation(...)`
    conventions: list[dict[str, Any]] = field(default_factory=list)  # `tables.conventions(...)`
    confusion: list[dict[str, Any]] = field(default_factory=list)  # `tables.confusion(...)`
    strongest_k: int | None = None  # evaluate.match_strongest: the diagnostic column beside Delta-MATCHScore


#: the sprite's data URI is written into a <style> block, where HTML escaping does not apply: anything but a base64
#: WebP data URI is refused rather than escaped
_WEBP_URI = re.compile(r"data:image/webp;base64,[A-Za-z0-9+/]+=*")


def sprite_css(uri: str | None, columns: int) -> Markup:
    """The CSS of the thumbnail class `.sp`: the sprite as background, the tile picked by the custom properties --c
    (column) and --r (row), drawn at the size --s (set per context)."""
    if uri is None:
        return Markup("")
    if not isinstance(uri, str) or not _WEBP_URI.fullmatch(uri):
        raise ValueError("sprite: expected a WebP data URI (data:image/webp;base64,...)")
    if not isinstance(columns, int) or columns < 1:
        raise ValueError(f"sprite_columns: expected an int >= 1, got {columns!r}")
    return Markup(f".sp{{background-image:url({uri});background-size:calc({columns} * var(--s)) auto;"
                  "background-position:calc(var(--c) * -1 * var(--s)) calc(var(--r) * -1 * var(--s))}")


def script_json(value: Any) -> Markup:
    """`value` as JSON that is safe inside a <script> element: every '<', '>' and '&' escaped, so no data string can
    close the element."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), allow_nan=False)
    return Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


#: the layout template every figure uses (figures.py: "plotly_white"): inlined once for the page (6.5 kB a figure saved),
#: the script gives it to each figure whose spec has none
TEMPLATE = "plotly_white"


def shared_template() -> dict[str, Any]:
    return pio.templates[TEMPLATE].to_plotly_json()


def figure_html(name: str, figure: Any) -> Markup:
    """A div and its figure's spec as inert JSON, without the shared layout template; the page's script draws it when
    it scrolls near the viewport (so the first screen does not wait for the figures below it)."""
    div_id = "fig-" + "".join(c if c.isalnum() else "-" for c in name)
    spec = json.loads(pio.to_json(figure, validate=False))
    if spec.get("layout", {}).get("template") == json.loads(json.dumps(shared_template())):
        del spec["layout"]["template"]
    elif "template" not in spec.get("layout", {}):
        raise ValueError(f"figures[{name!r}]: no layout template: give it one (the page would draw it with {TEMPLATE!r})")
    return Markup(f'<div id="{div_id}" class="figure"></div>\n'
                  f'<script type="application/json" class="figure-spec" data-for="{div_id}">{script_json(spec)}</script>')


def plotly_js() -> Markup:
    return Markup(resources.files("pipeline.report").joinpath("assets", PLOTLY_BUNDLE).read_text(encoding="utf-8"))


def bundle_version() -> str:
    """The vendored plotly.js version (from its banner, "plotly.js (basic - minified) v4.1.1")."""
    head = resources.files("pipeline.report").joinpath("assets", PLOTLY_BUNDLE).read_text(encoding="utf-8")[:300]
    match = re.search(r"\bv(\d+\.\d+\.\d+)", head)
    if match is None:
        raise ValueError(f"assets/{PLOTLY_BUNDLE}: no version in its banner")
    return match.group(1)


def render(data: ReportData) -> str:
    env = Environment(loader=PackageLoader("pipeline.report", "templates"), autoescape=select_autoescape(["html"]))
    template = env.get_template("report.html")
    page_script = resources.files("pipeline.report").joinpath("assets", "report.js").read_text(encoding="utf-8")
    return template.render(
        d=data,
        plotly_js=plotly_js(),
        page_js=Markup(page_script),
        figures={name: figure_html(name, fig) for name, fig in data.figures.items()},
        sprite_css=sprite_css(data.sprite, data.sprite_columns),
        explorer_json=script_json({**data.explorer, "open": data.explorer_default, "columns": data.sprite_columns}),
        config_json=script_json(CONFIG),
        template_json=script_json(shared_template()),
        terms=TERMS,
        fmt=fmt,
        pct=pct,
        tile=tile_style(data.sprite_columns),
    )


def tile_style(columns: int) -> Any:
    """A template function: the style attribute value placing sprite tile `index` ("--c:3;--r:1")."""

    def place(index: int | None) -> str:
        if index is None or index < 0:
            return ""
        return f"--c:{index % columns};--r:{index // columns}"

    return place


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
