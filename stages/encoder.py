"""Stage `encoder`: train the embedded offline CLIP-like model (or check a pretrained one) and measure zero-shot accuracy.

A pretrained encoder (`encoder.kind`: open_clip, hf_clip, dinov2, blip) is loaded once here so that
missing weights fail before extraction; its spec is recorded in store/encoder/spec.json.

The image tower is aligned contrastively to the frozen all-MiniLM-L6-v2 text encoder on the
training split's images and captions; zero-shot accuracy per attribute family is measured on
the held-out test split of the objects scenes. Outputs: store/encoder/ (safetensors + config.json) and
store/metrics/encoder.json. Reads params: seed, encoder.
"""

from __future__ import annotations

import json
import logging
import shutil
import time

import numpy as np

from pipeline.config import Params, PretrainedEncoder, load_params
from pipeline.encoders.registry import load_encoder, save_spec
from pipeline.dataset import open_dataset
from pipeline.encoders.embedded import EmbeddedConfig, load_embedded, save_embedded, train_embedded, zero_shot_accuracy
from pipeline.paths import Layout
from pipeline.store import replace_dir
from stages._cli import exit_with, parser, run_main

log = logging.getLogger(__name__)


def embedded_config(params: Params, image_size: int) -> EmbeddedConfig:
    e = params.encoder
    return EmbeddedConfig(embed_dim=e.embed_dim, width=e.width, image_size=image_size, epochs=e.epochs,
                          batch_size=e.batch_size, lr=e.lr, weight_decay=e.weight_decay, seed=params.seed)


def zero_shot(encoder, data, images: np.ndarray) -> dict:
    """Zero-shot accuracy per attribute family on the test split of the first kind with one-hot families."""
    kinds = [k for k in data.kinds if data.one_hot(k)]
    if not encoder.has_text or not kinds:
        log.warning("no zero-shot accuracy: %s", "the encoder has no text tower" if not encoder.has_text else "no one-hot attribute families")
        return {}
    rows = data.rows("test", kinds[0])
    return zero_shot_accuracy(encoder, images[rows], data.attributes[rows], data.families(kinds[0]), data.prompts)


def summary(encoder, accuracy: dict, seconds: float, history: list) -> dict:
    return {
        "encoder_id": encoder.id,
        "dim": encoder.dim,
        "has_text": encoder.has_text,
        "zero_shot": accuracy,
        "zero_shot_mean": float(np.mean([v["accuracy"] for v in accuracy.values()])) if accuracy else None,
        "chance_mean": float(np.mean([v["chance"] for v in accuracy.values()])) if accuracy else None,
        "train_seconds": seconds,
        "history": history,
    }


def run(params: Params, layout: Layout) -> dict:
    data = open_dataset(layout.data)
    images = data.images.read()
    tmp = layout.encoder.with_name(layout.encoder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    if isinstance(params.encoder, PretrainedEncoder):
        spec = params.encoder.spec()
        encoder = load_encoder(spec)  # fails fast (offline: a hub id not in the cache) before any work
        save_spec(spec, tmp, encoder.id, encoder.dim, encoder.has_text)
        metrics = summary(encoder, zero_shot(encoder, data, images), 0.0, [])
    else:
        train_rows, val_rows = data.rows("train"), data.rows("val")
        captions = np.asarray(data.captions, dtype=object)
        start = time.perf_counter()
        config = embedded_config(params, int(images.shape[1]))
        model, history = train_embedded(images[train_rows], captions[train_rows].tolist(), config,
                                        val=(images[val_rows], captions[val_rows].tolist()))
        seconds = time.perf_counter() - start
        save_embedded(model, config, tmp)
        encoder = load_embedded(tmp)  # measure what was saved, through the public loading path
        metrics = summary(encoder, zero_shot(encoder, data, images), seconds, history)
    replace_dir(tmp, layout.encoder)
    layout.encoder_metrics.parent.mkdir(parents=True, exist_ok=True)
    layout.encoder_metrics.write_text(json.dumps(metrics, indent=1))
    if metrics["zero_shot_mean"] is not None:
        log.info("zero-shot accuracy (mean over families) %.3f vs chance %.3f", metrics["zero_shot_mean"], metrics["chance_mean"])
    return metrics


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    return run_main("encoder", lambda: run(load_params(args.params), Layout(args.root)))


if __name__ == "__main__":
    exit_with(main())
