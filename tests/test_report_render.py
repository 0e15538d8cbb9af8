"""The report's page machinery (pipeline.report.render, thumbnails): the vendored plotly.js bundle matches the installed
plotly package and draws every trace type the figures use; the thumbnail sprite puts each image at its tile."""

from __future__ import annotations

import base64
import io

import numpy as np
import plotly
import pytest
from PIL import Image
from plotly.offline import get_plotlyjs_version

from pipeline.report.render import bundle_version, plotly_js, tile_style
from pipeline.report.thumbnails import sprite
from tests.test_report_browser import synthetic_report

#: the trace types plotly.js's basic bundle registers
BASIC_TRACES = {"scatter", "bar", "pie"}


def test_the_vendored_bundle_is_the_major_version_the_plotly_package_writes_for() -> None:
    ours, theirs = bundle_version(), get_plotlyjs_version()
    assert ours.split(".")[0] == theirs.split(".")[0], (
        f"plotly {plotly.__version__} ships plotly.js {theirs}; pipeline/report/assets/plotly-basic.min.js is {ours}: "
        "vendor the matching plotly.js-basic-dist-min (npm) release")
    assert "(basic - minified)" in str(plotly_js())[:200]


def test_every_figure_uses_only_trace_types_of_the_basic_bundle() -> None:
    used = {trace.type for fig in synthetic_report().figures.values() for trace in fig.data}
    assert used and used <= BASIC_TRACES, f"trace types outside the basic bundle: {used - BASIC_TRACES}"


def test_sprite_puts_each_image_at_its_tile() -> None:
    colours = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 0], [0, 255, 255]], np.uint8)
    images = np.repeat(np.repeat(colours[:, None, None, :], 4, axis=1), 4, axis=2)  # five flat 4 x 4 images
    uri = sprite(images, tile=8, columns=2, quality=None)
    assert uri.startswith("data:image/webp;base64,")
    sheet = np.asarray(Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).convert("RGB"))
    assert sheet.shape == (3 * 8, 2 * 8, 3)  # 5 tiles, 2 to a row: 3 rows; lossless, so exact
    place = tile_style(2)
    for i, rgb in enumerate(colours):
        assert place(i) == f"--c:{i % 2};--r:{i // 2}"
        assert (sheet[(i // 2) * 8:(i // 2 + 1) * 8, (i % 2) * 8:(i % 2 + 1) * 8] == rgb).all()
    assert place(-1) == "" and place(None) == ""
    lossy = np.asarray(Image.open(io.BytesIO(base64.b64decode(sprite(images, tile=32, columns=2).split(",", 1)[1]))).convert("RGB"))
    centres = lossy[[16, 16, 48, 48, 80], [16, 48, 16, 48, 16]].astype(int)  # the default, lossy quality 80: each tile's centre
    assert np.abs(centres - colours).max() < 24
    with pytest.raises(ValueError, match="images"):
        sprite(np.zeros((0, 4, 4, 3), np.uint8))
