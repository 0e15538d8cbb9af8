"""Extraction killed with SIGKILL mid-way resumes from its last complete chunk and ends identical to an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
import zarr

from pipeline.config import validate_params
from pipeline.paths import Layout
from pipeline.presets import preset_text
from pipeline.store import open_store
from stages import data as data_stage
from stages import encoder as encoder_stage
from stages import extract as extract_stage

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny dataset and embedded encoder, and params with small chunks (many resumable units)."""
    root = tmp_path_factory.mktemp("extract")
    raw = yaml.safe_load(preset_text("tiny"))
    raw["extract"] = {"batch_size": 8, "chunk_rows": 16}
    params_path = root / "params.yaml"
    params_path.write_text(yaml.safe_dump(raw))
    params = validate_params(raw)
    data_stage.run(params, Layout(root))
    encoder_stage.run(params, Layout(root))
    return root, params_path


def test_killed_extraction_resumes_and_matches_an_uninterrupted_run(prepared, tmp_path, caplog):
    root, params_path = prepared
    params = validate_params(yaml.safe_load(params_path.read_text()))
    # a slowed-down extraction in a subprocess, killed (SIGKILL) once a few chunks are on disk
    script = textwrap.dedent(f"""
        import time, sys
        from pipeline.encoders import embedded
        original = embedded.EmbeddedEncoder.encode_images
        def slow(self, images, batch_size=256):
            time.sleep(0.15)
            return original(self, images, batch_size)
        embedded.EmbeddedEncoder.encode_images = slow
        from stages.extract import main
        sys.exit(main(["--params", {str(params_path)!r}, "--root", {str(root)!r}]))
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TQDM_DISABLE="1")
    process = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    partial = root / "store" / "embeddings.tmp" / "images.zarr.partial"
    deadline = time.monotonic() + 120
    committed = 0
    while time.monotonic() < deadline and process.poll() is None:
        if partial.exists():
            try:
                committed = zarr.open_array(str(partial), mode="r").attrs.get("rows_committed", 0)
            except Exception:  # metadata being rewritten at this instant
                committed = 0
            if committed >= 48:
                break
        time.sleep(0.05)
    assert process.poll() is None, "the extraction finished before it could be killed"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (root / "store" / "embeddings").exists(), "a killed stage leaves no finished-looking output"
    done_before = zarr.open_array(str(partial), mode="r").attrs["rows_committed"]
    assert done_before >= 48 and done_before % 16 == 0

    with caplog.at_level("INFO", logger="pipeline.store"):
        extract_stage.run(params, Layout(root))  # the rerun resumes
    assert f"resuming after {done_before} rows already written" in caplog.text
    resumed = open_store(root / "store" / "embeddings" / "images.zarr").read()

    fresh_root = tmp_path / "fresh"
    (fresh_root / "store").mkdir(parents=True)
    for name in ["data", "encoder"]:
        os.symlink(root / "store" / name, fresh_root / "store" / name)
    extract_stage.run(params, Layout(fresh_root))
    uninterrupted = open_store(fresh_root / "store" / "embeddings" / "images.zarr").read()
    np.testing.assert_array_equal(resumed, uninterrupted)
    assert resumed.shape[0] == 360
    # the thread count the rows were computed with is part of what a resume must match (CPU sums depend on it)
    assert open_store(root / "store" / "embeddings" / "images.zarr").attrs["fingerprint"]["threads"] == params.threads
