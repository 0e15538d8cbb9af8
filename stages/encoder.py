"""Stage `encoder`: train the embedded offline CLIP-like model (or check a pretrained one) and measure zero-shot accuracy.

A pretrained encoder (`encoder.kind`: open_clip, hf_clip, dinov2, blip) is loaded once here so that missing
weights fail before extraction; its settings are recorded in store/encoder/spec.json.

The embedded model's image tower is aligned contrastively to the frozen all-MiniLM-L6-v2 text encoder on the
training split's images and captions (`pipeline.encoders.embedded`); zero-shot accuracy per attribute family is
measured on the held-out test split of the first kind with one-hot families (`pipeline.encoders.zero_shot`).
A dataset without images (the synthetic source brings its own embeddings) needs no encoder: the stage records
that in store/encoder/none.json and writes encoder.json without zero-shot accuracy.
Outputs: store/encoder/ and store/metrics/encoder.json (with the device the numbers were computed on).
Reads params: seed, encoder.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.atomic import atomic_dir
from pipeline.config import Params, load_params
from pipeline.data.dataset import Dataset, open_dataset, sample_rows
from pipeline.encoders.base import Encoder
from pipeline.encoders.embedded import load_embedded, save_embedded, train_embedded
from pipeline.encoders.options import EmbeddedSettings
from pipeline.encoders.registry import load_encoder, save_spec
from pipeline.encoders.zero_shot import zero_shot_accuracy
from pipeline.paths import Layout
from pipeline.records import write_json
from pipeline.store import open_store
from pipeline.training.device import device_name
from stages.runner import exit_with, parser, run_main

log = logging.getLogger(__name__)


#: zero-shot accuracy is measured on at most this many test images (a seeded subsample; a sanity check of the
#: encoder, whose standard error at this size is below half a percent), so the stage never reads a whole split
ZERO_SHOT_MAX_IMAGES = 10_000


def zero_shot(encoder: Encoder, data: Dataset, seed: int) -> dict[str, Any]:
    """Zero-shot accuracy per attribute family on the test split of the first kind with one-hot families."""
    kinds = [k for k in data.kinds if data.one_hot(k)]
    if not encoder.has_text or not kinds:
        log.warning("no zero-shot accuracy: %s", "the encoder has no text tower" if not encoder.has_text else "no one-hot attribute families")
        return {}
    rows = sample_rows(data.rows("test", kinds[0]), ZERO_SHOT_MAX_IMAGES, seed)
    return zero_shot_accuracy(encoder, data.images.take(rows), data.labels(rows), data.families(kinds[0]), data.prompts)


def summary(encoder: Encoder | None, accuracy: dict[str, Any], history: list[dict[str, float]], device: str, **identity: Any) -> dict[str, Any]:
    """encoder.json; `identity` (encoder_id, dim, has_text) replaces the encoder's when there is none."""
    return {
        "encoder_id": encoder.id if encoder is not None else identity["encoder_id"],
        "dim": encoder.dim if encoder is not None else identity["dim"],
        "has_text": encoder.has_text if encoder is not None else identity["has_text"],
        "device": device,
        "zero_shot": accuracy,
        "zero_shot_mean": float(np.mean([v["accuracy"] for v in accuracy.values()])) if accuracy else None,
        "chance_mean": float(np.mean([v["chance"] for v in accuracy.values()])) if accuracy else None,
        "history": history,
    }


def no_encoder(data: Dataset, layout: Layout, tmp: Path) -> dict[str, Any]:
    """encoder.json for a dataset that brings its own embeddings (no images to encode), and the stage's record."""
    embeddings = open_store(layout.data_embeddings / layout.image_embeddings.name)
    identity = {"encoder_id": embeddings.attrs["encoder"], "dim": int(embeddings.shape[1]), "has_text": True}
    write_json(tmp / "none.json", {**identity, "reason": "the dataset has no images: its source wrote the embeddings (store/data/embeddings)"})
    log.info("no encoder: %s brings its own embeddings (%s)", layout.data, identity["encoder_id"])
    return summary(None, {}, [], "none", **identity)


def run(params: Params, layout: Layout) -> dict[str, Any]:
    data = open_dataset(layout.data)
    with atomic_dir(layout.encoder) as tmp:
        metrics = no_encoder(data, layout, tmp) if not data.has_images else encode_and_measure(params, data, tmp)
    write_json(layout.encoder_metrics, metrics)
    if metrics["zero_shot_mean"] is not None:
        log.info("zero-shot accuracy (mean over families) %.3f vs chance %.3f", metrics["zero_shot_mean"], metrics["chance_mean"])
    return metrics


def encode_and_measure(params: Params, data: Dataset, tmp: Path) -> dict[str, Any]:
    """Train the embedded model (or load the pretrained one) into `tmp`; its encoder.json with zero-shot accuracy."""
    if isinstance(params.encoder, EmbeddedSettings):
        train_rows, val_rows = data.rows("train"), data.rows("val")
        start = time.perf_counter()
        model, history = train_embedded(data.images.take(train_rows), data.caption_rows(train_rows), params.encoder, params.seed,
                                        val=(data.images.take(val_rows), data.caption_rows(val_rows)))
        log.info("embedded model trained in %.1f s", time.perf_counter() - start)
        save_embedded(model, params.encoder, tmp)
        encoder = load_embedded(tmp)  # measure what was saved, through the public loading path
    else:
        encoder = load_encoder(params.encoder)  # fails fast (offline: a hub id not in the cache) before any work
        save_spec(params.encoder, tmp, encoder)
        history = []
    return summary(encoder, zero_shot(encoder, data, params.seed), history, device_name(getattr(encoder, "device", params.encoder.device)))


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    return run_main("encoder", lambda: run(load_params(args.params), Layout(args.root)))


if __name__ == "__main__":
    exit_with(main())
