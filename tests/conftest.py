"""Test settings: offline, single-threaded torch, deterministic."""

from __future__ import annotations

import os
import signal

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from pipeline.explain.decoder import decode_captions, train_decoder
from pipeline.explain.explanations import Concepts, KindData
from pipeline.explain.options import (
    DecoderSettings,  # noqa: E402
    ExplainSettings,  # noqa: E402
)
from pipeline.models.registry import build  # noqa: E402
from pipeline.training.options import TrainSettings  # noqa: E402
from tests.scratch import copy_repo, dvc, scratch_copy  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _sigterm_handler_restored():
    """A test that runs `cedar flow` or `cedar serve` in this process installs their SIGTERM handler (SystemExit
    143, `flow.commands.exit_cleanly_on_sigterm`); put pytest's own back after it, so that SIGTERM still stops the
    test run instead of ending whichever test is running."""
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


@pytest.fixture(autouse=True)
def _environment_restored():
    """A test that runs `cedar flow` in this process sets its Prefect defaults in os.environ (`setdefault`:
    PREFECT_HOME in that test's project, ...); put the environment back after it, so that a later test's `cedar`
    subprocess does not inherit them (seen: test_flow.py run after test_flow_dvc.py found no Prefect database in its
    project)."""
    saved = dict(os.environ)
    yield
    for key in set(os.environ) - set(saved):
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


COLOURS = ["red", "green", "blue", "yellow"]
CAPTIONS = [f"a {c} thing" for c in COLOURS]


@pytest.fixture(scope="session")
def identity_run() -> dict:
    """Identity basis around b (d = 4, k = 1); image j is b + e_j, captioned "a <colour j> thing" and labelled
    colour j; the vocabulary's text embeddings are e_0..e_3, named by the colours. Every image is exactly
    1-sparse around b, so its sparse reconstruction and its original-basis top-1 code equal the image."""
    b = np.array([0.5, -0.2, 0.1, 0.3], dtype=np.float32)
    x = (b + np.eye(4)).astype(np.float32)
    model = build("identity", 4, 4, 1)
    model.mean = b
    settings = DecoderSettings(width=32, heads=2, layers=1, dropout=0.0, drop_max=0.0, noise_std=0.0, device="cpu",
                               train=TrainSettings(epochs=60, min_steps=0, batch_size=4, lr=5e-3, weight_decay=0.01, min_lr_frac=0.0))
    decoder, _ = train_decoder(x, CAPTIONS, settings, seed=0)
    assert decode_captions(decoder, x) == CAPTIONS  # memorised: the rates below are then exact
    kind = KindData(kind="objects", rows=np.array([40, 41, 42, 43]), x=x, attributes=np.eye(4, dtype=bool), attribute_names=COLOURS,
                    families={"colour": [0, 1, 2, 3]}, phrases=[[c] for c in COLOURS], truth=CAPTIONS, scored=True, pair_ids=np.array([7]),
                    pairs_before=x[:1], pairs_after=x[1:2], pair_edits=["red → green"])
    concepts = Concepts(texts=COLOURS, embeddings=np.eye(4, dtype=np.float32))
    settings = ExplainSettings(top_names=2, top_m=2, caption_ks=(2, 9), examples=2, pairs=3, latents=10, top_images=3)
    return {"model": model, "decoder": decoder, "kind": kind, "concepts": concepts, "b": b, "settings": settings}


@pytest.fixture(scope="session")
def tiny_pristine(tmp_path_factory) -> Path:
    """A scratch copy of the project on the tiny preset in a fresh git repository, before any run (never changed)."""
    return scratch_copy(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny_repro(tiny_pristine) -> Path:
    """A copy of `tiny_pristine` (the same commit) after one undisturbed `dvc repro` (slow tests only; never changed:
    tests that change it work on a `tests.scratch.copy_repo` of it)."""
    repo = copy_repo(tiny_pristine, tiny_pristine.with_name("reproduced"))
    dvc(repo, "repro")
    return repo
