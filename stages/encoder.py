"""Stage `encoder`: train the embedded offline CLIP-like model (or check a pretrained one) and measure zero-shot accuracy.

A pretrained encoder (`encoder.kind`: open_clip, hf_clip, dinov2, blip) is loaded once here so that missing
weights fail before extraction; its settings are recorded in store/encoder/spec.json.

The embedded model's image tower is aligned contrastively to the frozen all-MiniLM-L6-v2 text encoder on the
training split's images and captions (`pipeline.encoders.embedded`); zero-shot accuracy per attribute family is
measured on the held-out test split of the first kind with one-hot families (`pipeline.encoders.zero_shot`).
Outputs: store/encoder/ and store/metrics/encoder.json. Reads params: seed, encoder.
"""

from __future__ import annotations

import logging
import shutil
import time
from typing import Any

import numpy as np

from pipeline.config import Params, load_params
from pipeline.data.dataset import Dataset, open_dataset
from pipeline.encoders.base import Encoder
from pipeline.encoders.embedded import EmbeddedSettings, load_embedded, save_embedded, train_embedded
from pipeline.encoders.registry import load_encoder, save_spec
from pipeline.encoders.zero_shot import zero_shot_accuracy
from pipeline.paths import Layout
from pipeline.records import write_json
from pipeline.store import replace_dir
from stages._cli import exit_with, parser, run_main

log = logging.getLogger(__name__)


def zero_shot(encoder: Encoder, data: Dataset, images: np.ndarray) -> dict[str, Any]:
    """Zero-shot accuracy per attribute family on the test split of the first kind with one-hot families."""
    kinds = [k for k in data.kinds if data.one_hot(k)]
    if not encoder.has_text or not kinds:
        log.warning("no zero-shot accuracy: %s", "the encoder has no text tower" if not encoder.has_text else "no one-hot attribute families")
        return {}
    rows = data.rows("test", kinds[0])
    return zero_shot_accuracy(encoder, images[rows], data.attributes[rows], data.families(kinds[0]), data.prompts)


def summary(encoder: Encoder, accuracy: dict[str, Any], history: list[dict[str, float]]) -> dict[str, Any]:
    return {
        "encoder_id": encoder.id,
        "dim": encoder.dim,
        "has_text": encoder.has_text,
        "zero_shot": accuracy,
        "zero_shot_mean": float(np.mean([v["accuracy"] for v in accuracy.values()])) if accuracy else None,
        "chance_mean": float(np.mean([v["chance"] for v in accuracy.values()])) if accuracy else None,
        "history": history,
    }


def run(params: Params, layout: Layout) -> dict[str, Any]:
    data = open_dataset(layout.data)
    images = data.images.read()
    tmp = layout.encoder.with_name(layout.encoder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    if isinstance(params.encoder, EmbeddedSettings):
        train_rows, val_rows = data.rows("train"), data.rows("val")
        captions = np.asarray(data.captions, dtype=object)
        start = time.perf_counter()
        model, history = train_embedded(images[train_rows], captions[train_rows].tolist(), params.encoder, params.seed,
                                        val=(images[val_rows], captions[val_rows].tolist()))
        log.info("embedded model trained in %.1f s", time.perf_counter() - start)
        save_embedded(model, params.encoder, tmp)
        encoder = load_embedded(tmp)  # measure what was saved, through the public loading path
    else:
        encoder = load_encoder(params.encoder)  # fails fast (offline: a hub id not in the cache) before any work
        save_spec(params.encoder, tmp, encoder)
        history = []
    metrics = summary(encoder, zero_shot(encoder, data, images), history)
    replace_dir(tmp, layout.encoder)
    write_json(layout.encoder_metrics, metrics)
    if metrics["zero_shot_mean"] is not None:
        log.info("zero-shot accuracy (mean over families) %.3f vs chance %.3f", metrics["zero_shot_mean"], metrics["chance_mean"])
    return metrics


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    return run_main("encoder", lambda: run(load_params(args.params), Layout(args.root)))


if __name__ == "__main__":
    exit_with(main())
