"""The HTML report in a real browser: headless Chromium opens a report rendered from small synthetic data
(no pipeline run) from file://, with no network. Checks: no console message at all (errors, failed loads),
plots drawn (plotly's SVGs in the DOM, the bar colours in a screenshot), and data strings carrying markup
shown as text, never run. Chromium: `apt-get install chromium` (/usr/bin/chromium); skipped without it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.report import figures
from pipeline.report.render import ReportData, image_css, render
from pipeline.report.tables import conventions, separation
from pipeline.report.thumbnails import png_data_uri
from pipeline.scoring.options import EvaluateSettings

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None)
EVIL = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--virtual-time-budget=5000"]
SPARSE_BLUE = (0x24, 0x58, 0xC6)  # figures.SOURCE_COLOURS["sparse"]
TOPK_ORANGE = (0xE8, 0xA3, 0x3D)  # figures.SOURCE_COLOURS["topk_original"]


def variant(score: float) -> dict:
    return {"match_score": score, "tapas": {"score": score / 2}, "delta_stay": 0.1, "cknna": 0.3, "fms": 0.4, "probe": None,
            "matching": {"fbmp_b0.5": {"test": {"3": score}}}}


def run_metrics(run: str, method: str, k: int, score: float, rotation: bool) -> dict:
    return {"run": run, "method": method, "size": 16 if rotation else 64, "k": k, "rotation": rotation, "n_test": 40,
            "trained": {"fvu": 0.2, "l0": k, "dead_fraction": 0.0}, "untrained": {"fvu": 0.5, "l0": k, "dead_fraction": 0.1},
            "train_seconds": 1.0, "concepts": {"objects": {"trained": variant(score), "untrained": variant(score / 2), "random": variant(0.1),
                                                           "delta_match_score": score / 2}}}


def synthetic_report() -> ReportData:
    """Two runs, one kind, every section filled; a concept name, a caption and a method name carry markup."""
    colours = {12: (200, 30, 30), 13: (30, 160, 60), 14: (40, 60, 200)}
    images = {f"r{row}": png_data_uri(np.full((16, 16, 3), rgb, np.uint8), 64) for row, rgb in colours.items()}
    images |= {"p0b": images["r12"], "p0a": images["r13"]}
    latents = [{"latent": "+0", "index": 0, "names": [EVIL, "red body"], "scores": [0.8, 0.5], "frequency": 0.5, "top_images": [12, 13]},
               {"latent": "-1", "index": 17, "names": ["blue body", "sky"], "scores": [0.7, 0.4], "frequency": 0.25, "top_images": [14]}]
    pairs = [{"kind": "objects", "pair": 0, "edit": "red body → green body", "on": [{"latent": "+1", "name": "green body"}],
              "off": [{"latent": "+0", "name": EVIL}]}]
    runs = [run_metrics("cedar-4", "cedar", 4, 0.6, True), run_metrics("topk-64-4", EVIL, 4, 0.5, False)]
    rates = {"objects": [
        {"run": "cedar-4", "method": "cedar", "k": 4, "n_images": 40, "dense": 0.8, "sparse": 0.7, "topk_original": 0.3,
         "attribute_precision": {"dense": 0.9, "sparse": 0.85, "topk_original": 0.6},
         "relevance": {"m": 5, "model_precision": 0.6, "model_recall": 0.4, "dense_precision": 0.7, "dense_recall": 0.5}},
        {"run": "topk-64-4", "method": EVIL, "k": 4, "n_images": 40, "dense": 0.8, "sparse": 0.5, "topk_original": 0.3,
         "attribute_precision": {}, "relevance": None},
    ]}
    curve = [{"kind": "objects", "k": k, "source": s, "rate": r, "attribute_precision": (1 + r) / 2}
             for k, a, b in [(1, 0.2, 0.1), (4, 0.7, 0.3), (16, 0.8, 0.6)] for s, r in (("sparse", a), ("topk_original", b))]
    explains = [{"run": "cedar-4", "describes": {"objects": {"dense": 0.8, "attribute_precision": {"dense": 0.9}}}, "describes_curve": curve}]
    example = {"kind": "objects", "row": 12, "truth": "a red circle on grass", "attributes": ["red body", "circle shape"],
               "dense_concepts": [["red body", 0.6]], "dense_caption": "a red circle", "dense_describes": True,
               "runs": [{"method": "cedar", "run": "cedar-4", "k": 4, "concepts": [["red body", 1.2]],
                         "captions": {"sparse": f"a red {EVIL} circle", "topk_original": "a blue square"},
                         "describes": {"sparse": True, "topk_original": False}}]}
    encoder = {"encoder_id": "embedded:test", "dim": 16, "zero_shot_mean": 0.7, "chance_mean": 0.2,
               "zero_shot": {"shape": {"accuracy": 0.8, "chance": 0.5, "n": 40, "confusion": [[18, 2], [6, 14]]},
                             "colour": {"accuracy": 0.6, "chance": 0.5, "n": 40, "confusion": [[12, 8], [8, 12]]}}}
    curves = [{"run": r["run"], "method": r["method"], "model": "trained", "k": k, "K": float(k), "fvu": 1 / (1 + k), "size": r["size"],
               "rotation": r["rotation"]} for r in runs for k in (1, 2, 4)]
    return ReportData(
        title=f"synthetic {EVIL}", code_version="test", params_yaml=f"title: {EVIL}\n",
        dataset={"kinds": {"objects": {"n": 200, "n_attributes": 34, "one_hot": True}}, "n": 200, "n_attributes": 34},
        encoder=encoder, runs=runs,
        figures={"fvu_vs_k": figures.fvu_vs_k(curves), "zero_shot": figures.zero_shot(encoder["zero_shot"]),
                 "zero_shot_confusion": figures.zero_shot_confusion(encoder["zero_shot"], {"shape": ["circle", EVIL], "colour": ["red", "blue"]}),
                 "scores_objects": figures.scores_vs_size(runs, "objects"), "sanity_summary_objects": figures.sanity_summary(runs, "objects"),
                 "sanity_objects": figures.sanity_panel(runs, "objects"), "explain_objects": figures.explanation_rates(rates["objects"], "objects"),
                 "describes_k_objects": figures.describes_vs_k(explains, "objects")},
        separation={"objects": separation(runs, "objects")}, conventions=conventions(EvaluateSettings(active_threshold=0.0)),
        latent_browser=[{"method": "cedar", "run": "cedar-4", "k": 4, "score": 0.6, "named": True, "latents": latents, "pairs": pairs}],
        examples=[example], rates=rates, images=images,
    )


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("report") / "index.html"
    path.write_text(render(synthetic_report()), encoding="utf-8")
    return path


def chromium(page: Path, profile: Path, *extra: str, timeout: float = 90) -> subprocess.CompletedProcess:
    """Run headless Chromium on `page`. A page that blocks (e.g. on an injected alert() dialog) fails the test."""
    try:
        return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra, page.as_uri()],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"chromium did not finish within {timeout} s: the page blocked (a JavaScript dialog such as an injected alert?)")


# --- without a browser ---------------------------------------------------------------------------------
def test_rendered_page_escapes_every_data_string(page: Path) -> None:
    html = page.read_text()
    assert EVIL not in html, "a data string reached the page unescaped"
    assert html.count(ESCAPED) >= 6  # title x2, concept name, switched latent, caption, method, params
    assert "https://" not in html.split("<script>", 1)[0] and 'src="http' not in html


def test_thumbnail_css_accepts_only_png_data_uris_and_plain_keys() -> None:
    uri = png_data_uri(np.zeros((4, 4, 3), np.uint8), 8)
    assert str(image_css({"r1": uri})) == f".im-r1{{background-image:url({uri})}}"
    with pytest.raises(ValueError, match="thumbnail key"):
        image_css({"r1}body{": uri})
    with pytest.raises(ValueError, match="PNG data URI"):
        image_css({"r1": "javascript:alert(1)"})
    with pytest.raises(ValueError, match="PNG data URI"):
        image_css({"r1": uri + ")}</style><script>"})


# --- in Chromium ---------------------------------------------------------------------------------------
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")


@needs_chromium
def test_report_loads_without_console_messages_and_keeps_markup_as_text(page: Path, tmp_path: Path) -> None:
    result = chromium(page, tmp_path / "profile", "--enable-logging=stderr", "--v=0", "--dump-dom")
    assert result.returncode == 0, result.stderr[-3000:]
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], "console messages:\n" + "\n".join(console)
    dom = result.stdout
    assert ESCAPED in dom, "the markup in data strings must be shown as text"
    assert "<script>alert(1)" not in dom, "an injected script element reached the DOM"
    assert len(re.findall(r'<svg class="main-svg"', dom)) >= 5, "plotly did not draw the figures"
    assert "–" in dom.split('id="explanations"', 1)[1]  # a run without attribute precision shows dashes, not an error
    assert 'id="explanations"' in dom and 'class="th im-r12"' in dom


@needs_chromium
def test_screenshot_shows_the_plots(page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "shot.png"
    result = chromium(page, tmp_path / "profile", "--window-size=1280,7000", f"--screenshot={shot}")
    assert result.returncode == 0 and shot.is_file(), result.stderr[-3000:]
    pixels = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3).astype(int)
    colours = len(np.unique(pixels[:: 7] @ np.array([1 << 16, 1 << 8, 1])))
    assert colours > 200, f"the page looks blank ({colours} colours)"
    for name, rgb in (("sparse blue", SPARSE_BLUE), ("top-k orange", TOPK_ORANGE)):
        close = (np.abs(pixels - np.array(rgb)).max(axis=1) <= 4).sum()
        assert close > 3000, f"too few {name} pixels ({close}): the bar plots did not render"
