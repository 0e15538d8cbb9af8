"""Training of one grid cell (method x dictionary size x k) on the image embeddings (run by `stages.cell`).

Streams shuffled batches of the training split from store/embeddings/images.zarr (a shuffle buffer over chunks,
never the whole store), validates on the validation split (at most `train.val_samples` rows of it), checkpoints every epoch in store/models/<run>.tmp/ so
a killed run resumes, and writes the final checkpoint (safetensors + config.json + history.json) to
store/models/<run>/ (`pipeline.training.sparse.train_sparse`).

A finished checkpoint records the fingerprint of everything its training read (`training_fingerprint`): the
method, size, k, seed, the method's options and loop settings, the embeddings' fingerprint, the training and
validation rows, and the source of the training code (`TRAINING_CODE`). When store/models/<run>/ already holds a
checkpoint with the current fingerprint, training is skipped and that model is reused, so that re-evaluating a
cell (new `evaluate` or `explain` params) never retrains it.
Reads params: seed, train, methods.<method>.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import time
from pathlib import Path

import numpy as np

from pipeline.config import Params
from pipeline.data.dataset import open_dataset, sample_rows
from pipeline.grid import Cell
from pipeline.models import build
from pipeline.models.checkpoint import read_config, save_model
from pipeline.paths import Layout
from pipeline.provenance import code_version, digest, rows_digest, source_digest
from pipeline.records import write_json
from pipeline.store import open_store, replace_dir
from pipeline.training.resume import load_resume, save_resume
from pipeline.training.sparse import train_sparse

log = logging.getLogger(__name__)

#: the source files and folders (relative to the repository root) whose code decides what training produces;
#: dvc.yaml lists each of them as a dependency of the grid-cell stages (a test checks it).
TRAINING_CODE = ("pipeline/models", "pipeline/training", "pipeline/settings.py", "pipeline/data/dataset.py", "pipeline/store.py",
                 "stages/train.py")
CODE_ROOT = Path(__file__).resolve().parents[1]


def training_fingerprint(params: Params, cell: Cell, embeddings: object, train_rows: np.ndarray, val_rows: np.ndarray) -> str:
    """Digest of every input of one cell's training: equal fingerprints train equal models."""
    return digest({
        "method": cell.method, "size": cell.size, "k": cell.k, "seed": params.seed,
        "options": params.method_options(cell.method), "train": dataclasses.asdict(params.train_settings(cell.method)),
        "embeddings": embeddings, "rows": [rows_digest(train_rows), rows_digest(val_rows)], "code": source_digest(TRAINING_CODE, CODE_ROOT),
    })


def recorded_fingerprint(directory: Path) -> str | None:
    """The training fingerprint of the finished checkpoint in `directory`; None if there is none or it is unreadable."""
    if not (directory / "model.safetensors").is_file() or not (directory / "history.json").is_file():
        return None
    try:
        return read_config(directory).get("provenance", {}).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None


def run(params: Params, layout: Layout, cell: Cell) -> Path:
    """Train the cell (or reuse its up-to-date checkpoint); returns the checkpoint directory store/models/<run>."""
    settings = params.train_settings(cell.method)
    data = open_dataset(layout.data)
    embeddings = open_store(layout.image_embeddings)
    train_rows, val_rows = data.rows("train"), sample_rows(data.rows("val"), settings.val_samples, params.seed)
    if len(embeddings) != len(data.split):
        raise ValueError(f"{embeddings.path}: {len(embeddings)} rows but the dataset has {len(data.split)} images; rerun extract")
    out = layout.model(cell.name)
    fingerprint = training_fingerprint(params, cell, embeddings.attrs.get("fingerprint"), train_rows, val_rows)
    if recorded_fingerprint(out) == fingerprint:
        log.info("%s: reusing %s (trained from the same inputs, fingerprint %s)", cell.name, out, fingerprint)
        return out
    init_rows = sample_rows(train_rows, settings.init_samples, params.seed)
    model = build(cell.method, embeddings.shape[1], cell.size, cell.k, seed=params.seed, **params.method_options(cell.method))
    work = layout.model_work(cell.name)
    start = time.perf_counter()
    result = train_sparse(
        model,
        embeddings.shuffled_batches(settings.batch_size, params.seed, rows=train_rows),
        math.ceil(len(train_rows) / settings.batch_size),
        embeddings.take(init_rows),
        embeddings.take(val_rows),
        settings,
        params.seed,
        save_state=lambda m, o, s, b: save_resume(work, m, o, s, b),
        load_state=lambda m, o: load_resume(work, m, o),
    )
    final = out.with_name(out.name + ".final")
    if final.exists():
        shutil.rmtree(final)
    provenance = {"run": cell.name, "size": cell.size, "code": code_version(layout.root), "embeddings": embeddings.attrs.get("fingerprint"),
                  "train": dataclasses.asdict(settings), "fingerprint": fingerprint}
    save_model(result.module.cpu(), final, provenance)
    write_json(final / layout.model_history(cell.name).name,
               {"history": result.history, "best_epoch": result.best_epoch, "stopped_early": result.stopped_early})
    replace_dir(final, out)
    shutil.rmtree(work, ignore_errors=True)
    log.info("%s: trained in %.1fs (best epoch %d)", cell.name, time.perf_counter() - start, result.best_epoch)
    return out
