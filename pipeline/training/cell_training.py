"""Training of one grid cell (method x dictionary size x k) on the image embeddings (`train_cell`; the stage
`stages.cell` runs it, then the evaluation).

Streams shuffled batches of the training split from store/embeddings/images.zarr (a shuffle buffer over chunks,
never the whole store), validates on the validation split (at most `train.val_samples` rows of it), checkpoints every epoch in store/models/<run>.tmp/ so
a killed run resumes, and writes the final checkpoint (safetensors + config.json + history.json) to
store/models/<run>/ (`pipeline.training.sparse.train_sparse`).

A finished checkpoint records the fingerprint of everything its training read (`training_fingerprint`): the
method, size, k, seed, the method's options and loop settings (every candidate of a learning-rate axis,
`pipeline.training.lr_axis`), the embeddings' fingerprint, the training and
validation rows, and the source of the training code (`TRAINING_CODE`). When store/models/<run>/ already holds a
checkpoint with the current fingerprint and intact weights (their digest is checked, `pipeline.models.checkpoint`),
training is skipped and that model is reused, so that re-evaluating a cell (new `evaluate` or `explain` params)
never retrains it. A damaged checkpoint is retrained with a warning naming it, and replaced.
Reads params: seed, train, methods.<method>.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import time
from pathlib import Path

import numpy as np

from pipeline.atomic import replace_dir
from pipeline.config import Params
from pipeline.data.dataset import open_dataset, sample_rows
from pipeline.grid import Cell
from pipeline.models.checkpoint import CheckpointError, load_model, read_config, save_model
from pipeline.models.registry import build
from pipeline.paths import Layout
from pipeline.provenance import code_digest, digest, rows_digest
from pipeline.records import write_json
from pipeline.store import open_store
from pipeline.training.loop import TrainResult
from pipeline.training.lr_axis import train_lr_axis
from pipeline.training.options import TrainSettings
from pipeline.training.resume import load_resume, save_resume
from pipeline.training.sparse import train_sparse

log = logging.getLogger(__name__)

#: the source files and folders (relative to the repository root) whose code decides what training produces;
#: dvc.yaml lists each of them as a dependency of the grid-cell stages (a test checks it).
TRAINING_CODE = ("pipeline/models", "pipeline/training", "pipeline/settings.py", "pipeline/data/dataset.py", "pipeline/store.py")


def training_fingerprint(params: Params, cell: Cell, embeddings: object, train_rows: np.ndarray, val_rows: np.ndarray) -> str:
    """Digest of every input of one cell's training: equal fingerprints train equal models."""
    return digest({
        "method": cell.method, "size": cell.size, "k": cell.k, "seed": params.seed,
        "options": params.method_options(cell.method), "train": [dataclasses.asdict(s) for s in params.train_candidates(cell.method)],
        "embeddings": embeddings, "rows": [rows_digest(train_rows), rows_digest(val_rows)], "code": code_digest(TRAINING_CODE),
    })


def reusable(directory: Path, fingerprint: str, history: Path) -> bool:
    """Whether `directory` holds a finished checkpoint trained with `fingerprint` whose weights are intact.

    A checkpoint that exists but cannot be reused as it is (damaged or missing weights, an unreadable config or
    history, an older schema) is reported in a warning naming it; the caller trains again and replaces it."""
    if not directory.exists():
        return False
    try:
        config = read_config(directory)
        provenance = config.get("provenance")
        if not isinstance(provenance, dict) or provenance.get("fingerprint") != fingerprint:
            log.info("%s: trained from other inputs; training again", directory)
            return False
        load_model(directory)  # checks the weights against their recorded digest, and that they fit the model
        if not isinstance(json.loads(history.read_text()), dict):
            raise CheckpointError(f"{history}: not a training history")
    except (CheckpointError, OSError, json.JSONDecodeError) as e:
        log.warning("%s: checkpoint cannot be reused (%s); training it again", directory, e)
        return False
    return True


def train_cell(params: Params, layout: Layout, cell: Cell) -> Path:
    """Train the cell (or reuse its up-to-date checkpoint); returns the checkpoint directory store/models/<run>."""
    settings = params.train_settings(cell.method)
    data = open_dataset(layout.data)
    embeddings = open_store(layout.image_embeddings)
    train_rows, val_rows = data.rows("train"), sample_rows(data.rows("val"), settings.val_samples, params.seed)
    if len(embeddings) != len(data.split):
        raise ValueError(f"{embeddings.path}: {len(embeddings)} rows but the dataset has {len(data.split)} images; rerun extract")
    out = layout.model(cell.name)
    fingerprint = training_fingerprint(params, cell, embeddings.attrs.get("fingerprint"), train_rows, val_rows)
    if reusable(out, fingerprint, layout.model_history(cell.name)):
        log.info("%s: reusing %s (trained from the same inputs, fingerprint %s)", cell.name, out, fingerprint)
        return out
    init_rows = sample_rows(train_rows, settings.init_samples, params.seed)
    start = time.perf_counter()

    def train_one(settings: TrainSettings, work: Path) -> TrainResult:  # one run of the learning-rate axis
        model = build(cell.method, embeddings.shape[1], cell.size, cell.k, seed=params.seed, **params.method_options(cell.method))
        return train_sparse(
            model,
            embeddings.shuffled_batches(settings.batch_size, params.seed, rows=train_rows),
            math.ceil(len(train_rows) / settings.batch_size),
            embeddings.take(init_rows),
            embeddings.take(val_rows),
            settings,
            params.seed,
            save_state=lambda m, o, s, b: save_resume(work, m, o, s, b, fingerprint),
            load_state=lambda m, o: load_resume(work, m, o, fingerprint),
        )

    work = layout.model_work(cell.name)
    choice = train_lr_axis(params.train_candidates(cell.method), train_one, work, fingerprint)
    result, settings = choice.result, choice.settings
    final = out.with_name(out.name + ".final")
    if final.exists():
        shutil.rmtree(final)
    provenance = {"run": cell.name, "size": cell.size, "embeddings": embeddings.attrs.get("fingerprint"),
                  "train": dataclasses.asdict(settings), "fingerprint": fingerprint}
    save_model(result.module.cpu(), final, provenance)
    write_json(final / layout.model_history(cell.name).name,
               {"history": result.history, "best_epoch": result.best_epoch, "stopped_early": result.stopped_early, **choice.record})
    replace_dir(final, out)
    shutil.rmtree(work, ignore_errors=True)
    log.info("%s: trained in %.1fs (best epoch %d)", cell.name, time.perf_counter() - start, result.best_epoch)
    return out
