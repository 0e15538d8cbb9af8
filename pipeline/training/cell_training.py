"""Training of one grid cell (method x dictionary size x k) on the image embeddings (`train_cell`; the stage
`stages.cell` runs it, then the evaluation).

Reads the training split of store/embeddings/images.zarr in the way `pipeline.training.feed.plan_feed` chooses
(resident on the training device when it fits `train.feed_memory`, else streamed; the validation split's sample of at
most `train.val_samples` rows and the initialisation sample are read in the same pass), validates after every epoch,
checkpoints every epoch but the last in store/models/<run>.tmp/ (in a background thread) so a killed run resumes,
and writes the final checkpoint (safetensors + config.json + history.json) to store/models/<run>/
(`pipeline.training.sparse.train_sparse`).

A finished checkpoint records the fingerprint of everything its training read (`training_fingerprint`): the
method, size, k, seed, the method's options and loop settings (every candidate of a learning-rate axis,
`pipeline.training.lr_axis`), the feed mode used (resident and streaming draw different batches), the CPU threads
(`threads`: torch's CPU sums depend on them), the embeddings' fingerprint, the training and validation rows, and
the source of the training code (`TRAINING_CODE`). When store/models/<run>/ already holds a
checkpoint with the current fingerprint and intact weights (their digest is checked, `pipeline.models.checkpoint`),
training is skipped and that model is reused, so that re-evaluating a cell (new `evaluate` or `explain` params)
never retrains it. A damaged checkpoint is retrained with a warning naming it, and replaced.

The wall-clock seconds of each part of the training (`Timings`: the process start before it, the device's start,
opening and fingerprinting, reading, initialisation, steps, validation, checkpoints, saving) go to
store/models/<run>.timings.json, beside the checkpoint and not in it: the checkpoint folder is a DVC output whose
bytes must be the same from run to run, and seconds are not.
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
from typing import Any

import numpy as np
import torch

from pipeline.atomic import replace_dir
from pipeline.config import Params
from pipeline.data.dataset import open_dataset, open_embeddings, sample_rows
from pipeline.grid import Cell
from pipeline.models.checkpoint import CheckpointError, load_model, read_config, save_model
from pipeline.models.registry import build, model_class
from pipeline.paths import Layout
from pipeline.provenance import code_digest, digest, rows_digest
from pipeline.records import write_json
from pipeline.training.device import device_name, resolve_device
from pipeline.training.feed import FeedPlan, load_rows, plan_feed, streaming_batches
from pipeline.training.loop import TrainResult, array_batches, preload_optimizer
from pipeline.training.lr_axis import train_lr_axis
from pipeline.training.options import TrainSettings
from pipeline.training.resume import Checkpoints, load_resume
from pipeline.training.sparse import train_sparse

log = logging.getLogger(__name__)

#: the source files and folders (relative to the repository root) whose code decides what training produces;
#: dvc.yaml lists each of them as a dependency of the grid-cell stages (a test checks it).
TRAINING_CODE = ("pipeline/models", "pipeline/training", "pipeline/settings.py", "pipeline/data/dataset.py", "pipeline/store.py")


#: loop settings that do not change the batches by themselves (the feed mode they lead to is fingerprinted instead)
FEED_SETTINGS = ("feed", "feed_memory", "shuffle_rows")


def training_fingerprint(params: Params, cell: Cell, embeddings: object, train_rows: np.ndarray, val_rows: np.ndarray, feed: FeedPlan) -> str:
    """Digest of every input of one cell's training: equal fingerprints train equal models. The memory settings
    enter through what they decide, `feed.identity` (the mode, and streaming's shuffle window)."""
    return digest({
        "method": cell.method, "size": cell.size, "k": cell.k, "seed": params.seed,
        "options": params.method_options(cell.method),
        "train": [{k: v for k, v in dataclasses.asdict(s).items() if k not in FEED_SETTINGS} for s in params.train_candidates(cell.method)],
        "feed": feed.identity, "threads": params.threads, "embeddings": embeddings,
        "rows": [rows_digest(train_rows), rows_digest(val_rows)], "code": code_digest(TRAINING_CODE),
    })


def process_seconds() -> float:
    """Seconds since this process started (the interpreter, its imports, reading params before the caller)."""
    import psutil

    return max(0.0, time.time() - psutil.Process().create_time())


class Timings:
    """Wall-clock seconds of the named parts of a training, in order (`part(name)` times the code after it up to the
    next part)."""

    def __init__(self) -> None:
        self.start = self.mark = time.perf_counter()
        self.seconds: dict[str, float] = {"process_start": process_seconds()}
        self.name: str | None = None

    def part(self, name: str | None) -> None:
        now = time.perf_counter()
        if self.name is not None:
            self.seconds[self.name] = self.seconds.get(self.name, 0.0) + now - self.mark
        self.name, self.mark = name, now

    def record(self, **extra: Any) -> dict[str, Any]:
        """The parts (seconds, rounded to ms), the total of this function's work, and `extra`."""
        self.part(None)
        total = time.perf_counter() - self.start
        steps = self.seconds.get("steps", 0.0)
        return {"seconds": {k: round(v, 3) for k, v in self.seconds.items()} | {"total": round(total, 3)},
                "steps_share": round(steps / total, 3) if total > 0 else None,
                "steps_share_with_process_start": round(steps / (total + self.seconds["process_start"]), 3) if total > 0 else None, **extra}


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
    timings = Timings()
    timings.part("open")
    settings = params.train_settings(cell.method)
    data = open_dataset(layout.data)
    embeddings = open_embeddings(data, layout.image_embeddings)
    train_rows, val_rows = data.rows("train"), sample_rows(data.rows("val"), settings.val_samples, params.seed)
    timings.part("device")
    device = resolve_device(settings.device)
    if device.type == "cuda":
        torch.cuda.init()
        torch.empty(1, device=device)  # the context and the allocator start here, not inside the first step
    timings.part("open")
    row_bytes = int(np.prod(embeddings.shape[1:])) * 4
    if model_class(cell.method).trainable:
        feed = plan_feed(settings, len(train_rows), row_bytes, embeddings.chunk_rows, device)
    else:
        feed = FeedPlan("none", 0, 0, 0, "no optimiser steps: the basis is fitted on the initialisation sample")
    out = layout.model(cell.name)
    fingerprint = training_fingerprint(params, cell, embeddings.attrs.get("fingerprint"), train_rows, val_rows, feed)
    if reusable(out, fingerprint, layout.model_history(cell.name)):
        log.info("%s: reusing %s (trained from the same inputs, fingerprint %s)", cell.name, out, fingerprint)
        return out
    log.info("%s: %s", cell.name, feed.why)
    preload_optimizer()  # overlaps the reading below
    timings.part("read")
    init_rows = sample_rows(train_rows, settings.init_samples, params.seed)
    if feed.mode == "resident":
        rows = load_rows(embeddings, {"train": train_rows, "val": val_rows}, device)
        init = rows["train"].index_select(0, torch.from_numpy(np.searchsorted(train_rows, init_rows)).to(device))
        batches = array_batches(rows["train"], settings.batch_size, params.seed)
    else:
        rows = load_rows(embeddings, {"init": init_rows, "val": val_rows}, device)
        init = rows["init"]
        batches = streaming_batches(embeddings, train_rows, settings.batch_size, params.seed, feed.window_chunks, device) \
            if feed.mode == "streaming" else lambda epoch: iter(())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    timings.part("train")

    def train_one(candidate: TrainSettings, work: Path) -> TrainResult:
        """One run of the learning-rate axis (candidates differ in lr only, so they share the rows read above and
        draw the same batches); its epoch checkpoints go to `work`."""
        model = build(cell.method, embeddings.shape[1], cell.size, cell.k, seed=params.seed, **params.method_options(cell.method))
        checkpoints = Checkpoints(work, fingerprint)
        try:
            return train_sparse(model, batches, math.ceil(len(train_rows) / candidate.batch_size), init, rows["val"], candidate, params.seed,
                                save_state=checkpoints.save, load_state=lambda m, o: load_resume(work, m, o, fingerprint))
        finally:
            checkpoints.close()

    work = layout.model_work(cell.name)
    choice = train_lr_axis(params.train_candidates(cell.method), train_one, work, fingerprint)
    result, settings = choice.result, choice.settings
    timings.part("save")
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
    trained = timings.seconds.pop("train")  # split into the parts train_sparse timed itself (of the kept run; the other
    # runs of a learning-rate axis, and a kept run resumed from its finished folder, fall in "train_other")
    timings.seconds.update({key: value for key, value in result.timings.items() if key != "steps_run"})
    timings.seconds["train_other"] = max(0.0, trained - sum(v for k, v in result.timings.items() if k != "steps_run"))
    record = timings.record(run=cell.name, device=device_name(device), feed=feed.mode, feed_why=feed.why, steps=int(result.timings.get("steps_run", 0)),
                            batch_size=settings.batch_size)
    write_json(layout.model_timings(cell.name), record)
    log.info("%s: trained in %.1fs (best epoch %d; %s)", cell.name, record["seconds"]["total"], result.best_epoch,
             ", ".join(f"{k} {v:.2f}s" for k, v in record["seconds"].items() if k != "total"))
    return out
