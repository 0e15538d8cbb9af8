"""The HTML report in a real browser: headless Chromium (driven over its DevTools pipe, tests/chromium.py) opens a report
rendered from small synthetic records (no pipeline run) from file://. Checks what a reader does: the headline table names
the best method per k; the k buttons keep every method in the legend; a table sorts on a header click; the latent
search finds a latent by id; the page logs nothing to the console and requests nothing beyond its own file and data:
URIs; data strings carrying markup are shown as text, never run. Chromium: `apt-get install chromium`; skipped without it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.report import figures, headline
from pipeline.report.render import ReportData, render, script_json, sprite_css
from pipeline.report.tables import confusion, conventions, example_table, explorer, rates_table, separation
from pipeline.report.thumbnails import sprite
from pipeline.scoring.options import EvaluateSettings
from tests.chromium import CHROMIUM, Browser

EVIL = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
SPARSE_BLUE = (0x00, 0x72, 0xB2)  # figures.SOURCE_COLOURS["sparse"]
TOPK_ORANGE = (0xE6, 0x9F, 0x00)  # figures.SOURCE_COLOURS["topk_original"]


def variant(score: float) -> dict:
    return {"match_score": score, "tapas": {"score": score / 2}, "delta_stay": 0.1, "cknna": 0.3, "fms": 0.4, "probe": None,
            "matching": {"fbmp_b0.5": {"test": {"3": score}}}, "coalitions": [[0], [1, 17]]}


def run_metrics(run: str, method: str, size: int, k: int, score: float, rotation: bool, learned: bool = True) -> dict:
    return {"run": run, "method": method, "size": size, "k": k, "rotation": rotation, "n_test": 40, "best_epoch": 3 if learned else 0,
            "trained": {"fvu": 0.2 / k + score / 100, "l0": k, "dead_fraction": 0.0}, "untrained": {"fvu": 0.5, "l0": k, "dead_fraction": 0.1},
            "concepts": {"objects": {"trained": variant(score), "untrained": variant(score / 2 if learned else score), "random": variant(0.1),
                                     "delta_match_score": score / 2 if learned else 0.0}}}


#: (run, method, size, k, MATCHScore, rotation, learned): at k = 4 topk leads, at k = 8 cedar; EVIL is a method name
RUNS = [("cedar-4", "cedar", 16, 4, 0.6, True, True), ("cedar-8", "cedar", 16, 8, 0.8, True, True),
        ("pca-4", "pca", 16, 4, 0.5, True, False), ("pca-8", "pca", 16, 8, 0.55, True, False),
        ("topk-32-4", "topk", 32, 4, 0.65, False, True), ("topk-64-4", "topk", 64, 4, 0.7, False, True),
        ("topk-32-8", "topk", 32, 8, 0.6, False, True), (f"{EVIL}-32-4", EVIL, 32, 4, 0.3, False, True),
        (f"{EVIL}-32-8", EVIL, 32, 8, 0.35, False, True)]


def explain_record(run: str, method: str, k: int) -> dict:
    latents = [{"latent": "+0", "index": 0, "names": [EVIL, "red body"], "scores": [0.8, 0.1], "frequency": 0.5, "top_images": [12, 13],
                "top_values": [2.5, 1.25], "histogram": {"max": 2.5, "counts": [3, 0, 1, 2]}, "matches": {"objects": ["red body", 0.9]}},
               {"latent": "-17", "index": 17, "names": ["blue body", "sky"], "scores": [0.7, 0.4], "frequency": 0.25, "top_images": [14],
                "top_values": [0.5], "histogram": {"max": 0.5, "counts": [0, 0, 0, 1]}, "matches": {"objects": None}}]
    pairs = [{"kind": "objects", "pair": 0, "edit": "red body → green body", "on": [{"latent": "+1", "name": "green body"}],
              "off": [{"latent": "+0", "name": EVIL}]}]
    curve = [{"kind": "objects", "k": kk, "source": s, "rate": r, "attribute_precision": (1 + r) / 2}
             for kk, a, b in [(1, 0.2, 0.1), (4, 0.7, 0.3), (16, 0.8, 0.6)] for s, r in (("sparse", a), ("topk_original", b))]
    example = {"kind": "objects", "row": 12, "truth": "a red circle on grass", "attributes": ["red body", "circle shape"],
               "concepts": [["red body", 1.2]], "dense_concepts": [["red body", 0.6]],
               "captions": {"dense": "a red circle", "sparse": f"a red {EVIL} circle", "topk_original": "a blue square"},
               "describes": {"dense": True, "sparse": True, "topk_original": False}}
    rates = {"n_images": 40, "k": k, "dense": 0.8, "sparse": 0.7, "topk_original": 0.3,
             "attribute_precision": {"dense": 0.9, "sparse": 0.85, "topk_original": 0.6}}
    relevance = {"m": 5, "model": {"precision": 0.6, "recall": 0.4}, "dense": {"precision": 0.7, "recall": 0.5}}
    return {"run": run, "method": method, "k": k, "named": True, "latents": latents, "pairs": pairs, "examples": [example],
            "naming_floor": {"n": 1000, "mean": 0.15, "p95": 0.2, "max": 0.3}, "describes": {"objects": rates},
            "relevance": {"objects": relevance}, "describes_curve": curve if method == "cedar" else []}


def synthetic_report() -> ReportData:
    """Nine runs over two k, one kind, every section filled; a method, a concept name, a caption and the title carry markup."""
    runs = [run_metrics(*r) for r in RUNS]
    explains = {r["run"]: explain_record(r["run"], r["method"], r["k"]) for r in runs}
    colours = {12: (200, 30, 30), 13: (30, 160, 60), 14: (40, 60, 200)}
    pixels = np.stack([np.full((16, 16, 3), rgb, np.uint8) for rgb in [*colours.values(), colours[12], colours[13]]])
    tiles = {"r12": 0, "r13": 1, "r14": 2, "p0b": 3, "p0a": 4}
    best = {(r["method"], r["k"]): r["run"] for r in runs if r["run"] != "topk-32-4"}
    rates = rates_table(list(explains.values()))
    encoder = {"encoder_id": "embedded:test", "dim": 16, "zero_shot_mean": 0.7, "chance_mean": 0.2, "device": "cpu",
               "zero_shot": {"shape": {"accuracy": 0.8, "chance": 0.5, "n": 40, "confusion": [[18, 2], [6, 14]]},
                             "colour": {"accuracy": 0.6, "chance": 0.5, "n": 40, "confusion": [[12, 8], [8, 12]]}}}
    curves = [{"run": r["run"], "method": r["method"], "model": model, "k": k, "K": float(k), "fvu": 1 / (1 + k), "size": r["size"],
               "rotation": r["rotation"]} for r in runs for k in (1, 2, 4) for model in ("trained", "untrained")]
    table = headline.headline(runs, "objects")
    best_rates = [r for r in rates["objects"] if best.get((r["method"], r["k"])) == r["run"]]
    return ReportData(
        title=f"synthetic {EVIL}", params_yaml=f"title: {EVIL}\n",
        provenance={"code_digest": "test", "git_commit": None, "device": "cpu", "versions": {"numpy": np.__version__},
                    "training_time": "not recorded"},
        dataset={"kinds": {"objects": {"n": 200, "n_attributes": 34, "one_hot": True}}, "n": 200, "n_attributes": 34},
        encoder=encoder, runs=runs,
        pairs=[{"kind": "objects", "pair": 0, "family": "body colour", "edit": f"red → {EVIL}", "before": 3, "after": 4}],
        figures={"scores_k_objects": figures.scores_vs_k(table), "fvu_vs_k": figures.fvu_vs_k(curves), "zero_shot": figures.zero_shot(encoder["zero_shot"]),
                 "scores_objects": figures.scores_vs_size(runs, "objects"), "sanity_summary_objects": figures.sanity_summary(runs, "objects"),
                 "sanity_objects": figures.sanity_panel(runs, "objects"), "explain_objects": figures.explanation_rates(best_rates, "objects"),
                 "describes_k_objects": figures.describes_vs_k([explains["cedar-4"]], "objects")},
        headline={"objects": table}, sentences={"objects": headline.sentences(table)},
        sanity={"objects": headline.sanity_sentences(separation(runs, "objects"))},
        explorer=explorer(runs, explains, {"objects": ["red body", EVIL]}, tiles), explorer_default=["cedar-8", "topk-64-4"],
        examples=example_table(explains, best), rates=rates, sprite=sprite(pixels, 16, 4), sprite_columns=4, tiles=tiles,
        separation={"objects": separation(runs, "objects")}, conventions=conventions(EvaluateSettings(active_threshold=0.0)),
        confusion=confusion(encoder["zero_shot"], {"shape": ["circle", EVIL], "colour": ["red", "blue"]}),
    )


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("report") / "index.html"
    path.write_text(render(synthetic_report()), encoding="utf-8")
    return path


# --- without a browser ---------------------------------------------------------------------------------
def test_rendered_page_escapes_every_data_string(page: Path) -> None:
    html = page.read_text()
    assert EVIL not in html, "a data string reached the page unescaped"
    assert html.count(ESCAPED) >= 6  # title x2, method names, concept name, caption, params, edit
    head = html.split("<script", 1)[0]
    assert "http://" not in head.replace("http://www.w3.org", "") and "https://" not in head
    assert "Content-Security-Policy" in head and "default-src 'none'" in head


def test_sprite_css_and_script_json_refuse_what_could_break_out() -> None:
    uri = sprite(np.zeros((2, 4, 4, 3), np.uint8), 8, 2)
    assert str(sprite_css(uri, 2)).startswith(f".sp{{background-image:url({uri});")
    with pytest.raises(ValueError, match="WebP data URI"):
        sprite_css("javascript:alert(1)", 2)
    with pytest.raises(ValueError, match="WebP data URI"):
        sprite_css(uri + ")}</style><script>", 2)
    assert "</script>" not in str(script_json({"x": "</script><script>alert(1)</script>"}))
    assert json.loads(str(script_json({"x": "</script>&"}))) == {"x": "</script>&"}


# --- in Chromium ---------------------------------------------------------------------------------------
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")


@pytest.fixture(scope="module")
def browser(page: Path):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    with Browser(width=1400, height=1000) as b:
        b.open(page)
        b.js("window.cedarReport.drawAll()")
        yield b


@needs_chromium
def test_page_is_quiet_offline_and_keeps_markup_as_text(browser: Browser, page: Path) -> None:
    assert browser.events.console == [], "console messages:\n" + "\n".join(browser.events.console)
    assert browser.events.exceptions == []
    outside = [url for url in browser.events.requests if not url.startswith(("file://", "data:"))]
    assert outside == [], f"the page requested {outside}"
    assert browser.js("document.querySelectorAll('svg.main-svg').length") >= 8, "plotly did not draw the figures"
    assert browser.js("document.querySelectorAll('script:not([type]):not([src])').length") == 2  # plotly.js and the page's own
    assert ESCAPED in browser.js("document.body.innerHTML"), "the markup in data strings must be shown as text"
    assert browser.js("[...document.querySelectorAll('.concept')].some(e => e.textContent.includes('<script>'))")
    titles = browser.js("[...document.querySelectorAll('.modebar-btn')].map(b => b.getAttribute('data-title') || '')")
    assert titles and not [t for t in titles if any(w in t.lower() for w in ("cloud", "chart studio", "share", "plotly"))], titles
    assert browser.js("document.querySelectorAll('.modebar .plotlyjsicon').length") == 0, "no logo link to plotly's site"
    provenance = browser.js("[...document.querySelectorAll('#provenance th')].map(t => t.textContent)")
    assert provenance[:4] == ["code digest", "git commit", "report built", "device"]
    built = browser.js("document.querySelector('#provenance .built-time').textContent")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", built), built  # the file's modification time


@needs_chromium
def test_headline_table_names_the_best_method_per_k(browser: Browser) -> None:
    best = browser.js("""[...document.querySelectorAll('#headline-table-objects tbody tr')]
        .filter(r => r.cells[3].classList.contains('best')).map(r => [r.cells[0].textContent, r.cells[1].textContent])""")
    assert best == [["4", "topk"], ["8", "cedar"]]
    sentences = browser.js("[...document.querySelectorAll('#headline ul.lead')[0].querySelectorAll('li')].map(l => l.textContent)")
    assert sentences[0].startswith("At k = 4, topk (topk-64-4) has the highest MATCHScore, 0.700, 0.100 above the next method, cedar (0.600)")
    assert sentences[1].startswith("At k = 8, cedar (cedar-8) has the highest MATCHScore, 0.800")
    fixed = browser.js("[...document.querySelectorAll('#headline-table-objects td.fixed')].map(c => c.textContent)")
    assert fixed == ["0 (fixed)", "0 (fixed)"], "a fixed basis's Delta-MATCHScore is 0 by construction, not a red failure"


@needs_chromium
def test_k_buttons_keep_every_method_in_the_legend(browser: Browser) -> None:
    legend = """[...document.querySelectorAll('#fig-scores-objects .legendtext')].map(e => e.textContent).sort()"""
    methods = sorted({r[1] for r in RUNS})
    assert browser.js(legend) == methods
    buttons = browser.js("document.querySelectorAll('#fig-scores-objects .updatemenu-button').length")
    assert buttons == 2
    for i in (1, 0, 1):
        browser.click("#fig-scores-objects .updatemenu-button", i)
        assert browser.js(legend) == methods, f"after button {i}"
        visible = browser.js("document.getElementById('fig-scores-objects').data.filter(t => t.visible === true).map(t => t.meta)")
        assert set(visible) == {(4, 8)[i]}, "a button shows its k only"


@needs_chromium
def test_fvu_twins_stay_visible_once_turned_on(browser: Browser) -> None:
    assert browser.js("document.getElementById('fig-fvu-vs-k').layout.updatemenus") in (None, [])  # panels, not buttons
    index = browser.js("[...document.querySelectorAll('#fig-fvu-vs-k g.traces')].findIndex(g => g.textContent === 'untrained twins')")
    browser.click("#fig-fvu-vs-k g.traces rect.legendtoggle", index, wait=1.0)
    twins = browser.js("document.getElementById('fig-fvu-vs-k').data.filter(t => t.legendgroup === 'untrained').map(t => t.visible)")
    assert twins and all(v is True for v in twins), twins


@needs_chromium
def test_a_table_sorts_on_a_header_click(browser: Browser) -> None:
    runs = "[...document.querySelectorAll('#runs-table tbody tr')].map(r => r.cells[0].textContent)"
    before = browser.js(runs)
    browser.js("document.querySelectorAll('#runs-table thead th')[4].click()")  # FVU
    fvu = browser.js("[...document.querySelectorAll('#runs-table tbody tr')].map(r => parseFloat(r.cells[4].textContent))")
    assert fvu == sorted(fvu) and browser.js(runs) != before
    assert browser.js("document.querySelectorAll('#runs-table thead th')[4].getAttribute('aria-sort')") == "ascending"
    browser.js("document.querySelectorAll('#runs-table thead th')[4].click()")
    assert browser.js("document.querySelectorAll('#runs-table thead th')[4].getAttribute('aria-sort')") == "descending"
    browser.js("(f => { f.value = 'cedar'; f.dispatchEvent(new Event('input')); })(document.querySelector('input.table-filter[data-for=runs-table]'))")
    shown = browser.js("[...document.querySelectorAll('#runs-table tbody tr')].filter(r => !r.hidden).map(r => r.cells[0].textContent)")
    assert sorted(shown) == ["cedar-4", "cedar-8"]


@needs_chromium
def test_latent_search_finds_a_latent_by_id_and_by_name_in_both_panels(browser: Browser) -> None:
    cards = "[...document.querySelectorAll('#explorer-{} .card')].map(c => c.getAttribute('data-latent'))"
    assert browser.js(cards.format("left")) == ["+0", "-17"]
    assert browser.js("document.querySelector('#explorer-left select.run-select').selectedOptions[0].textContent").startswith("cedar-8")
    assert browser.js("document.querySelector('#explorer-right select.run-select').selectedOptions[0].textContent").startswith("topk-64-4")
    search = "(s => {{ s.value = {!r}; s.dispatchEvent(new Event('input')); }})(document.getElementById('latent-search'))"
    browser.js(search.format("17"))
    assert browser.js(cards.format("left")) == ["-17"] and browser.js(cards.format("right")) == ["-17"]
    browser.js(search.format("sky"))
    assert browser.js(cards.format("left")) == ["-17"]
    browser.js(search.format(""))
    card = browser.js("document.querySelector('#explorer-left .card').textContent")
    assert "red body (F1 0.90)" in card and "2.50" in card and "FBMP coalition of red body (objects)" in card
    assert browser.js("document.querySelectorAll('#explorer-left .card svg.hist rect').length") == 8
    assert browser.js("document.querySelectorAll('#explorer-left .card .concept.weak').length") == 1  # 0.1 < the floor 0.2
    browser.js("(s => { s.selectedIndex = 4; s.dispatchEvent(new Event('change')); })(document.querySelector('#explorer-left select.run-select'))")
    assert browser.js("document.querySelector('#explorer-left .run-summary').textContent").startswith("topk · k = 4 · 32 latents")


@needs_chromium
def test_screenshot_shows_the_plots_and_the_page_fits_1024_px(page: Path, tmp_path: Path) -> None:
    with Browser(width=1024, height=900) as b:
        b.open(page)
        assert b.js("document.documentElement.scrollWidth <= window.innerWidth"), "the page scrolls sideways at 1024 px"
        b.js("document.querySelectorAll('details').forEach(d => d.open = true); window.cedarReport.drawAll()")
        b.js("new Promise(r => setTimeout(r, 300))")
        assert b.js("document.documentElement.scrollWidth <= window.innerWidth"), "the page scrolls sideways at 1024 px"
        shot = tmp_path / "shot.png"
        b.screenshot(shot, full_page=True)
    pixels = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3).astype(int)
    colours = len(np.unique(pixels[::7] @ np.array([1 << 16, 1 << 8, 1])))
    assert colours > 200, f"the page looks blank ({colours} colours)"
    for name, rgb in (("sparse blue", SPARSE_BLUE), ("top-k orange", TOPK_ORANGE)):
        close = (np.abs(pixels - np.array(rgb)).max(axis=1) <= 4).sum()
        assert close > 3000, f"too few {name} pixels ({close}): the bar plots did not render"
