"""Stage `encoder`: train the embedded offline CLIP-like model and measure its zero-shot accuracy.

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

from pipeline.config import Params, load_params
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


def run(params: Params, layout: Layout) -> dict:
    data = open_dataset(layout.data)
    train_rows, val_rows = data.rows("train"), data.rows("val")
    images = data.images.read()
    captions = np.asarray(data.captions, dtype=object)
    start = time.perf_counter()
    model, history = train_embedded(images[train_rows], captions[train_rows].tolist(), embedded_config(params, int(images.shape[1])),
                                    val=(images[val_rows], captions[val_rows].tolist()))
    train_seconds = time.perf_counter() - start
    tmp = layout.encoder.with_name(layout.encoder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    save_embedded(model, embedded_config(params, int(images.shape[1])), tmp)
    encoder = load_embedded(tmp)  # measure what was saved, through the public loading path
    kinds = [k for k in data.kinds if data.one_hot(k)]
    if not kinds:
        raise ValueError(f"{layout.data}: zero-shot accuracy needs a kind with one-hot attribute families (e.g. objects)")
    rows = data.rows("test", kinds[0])
    accuracy = zero_shot_accuracy(encoder, images[rows], data.attributes[rows], data.families(kinds[0]), data.prompts)
    metrics = {
        "encoder_id": encoder.id,
        "dim": encoder.dim,
        "zero_shot": accuracy,
        "zero_shot_mean": float(np.mean([v["accuracy"] for v in accuracy.values()])),
        "chance_mean": float(np.mean([v["chance"] for v in accuracy.values()])),
        "train_seconds": train_seconds,
        "history": history,
    }
    replace_dir(tmp, layout.encoder)
    layout.encoder_metrics.parent.mkdir(parents=True, exist_ok=True)
    layout.encoder_metrics.write_text(json.dumps(metrics, indent=1))
    log.info("zero-shot accuracy (mean over families) %.3f vs chance %.3f", metrics["zero_shot_mean"], metrics["chance_mean"])
    return metrics


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    return run_main("encoder", lambda: run(load_params(args.params), Layout(args.root)))


if __name__ == "__main__":
    exit_with(main())
