"""The learning-rate axis of a grid cell (params.yaml `methods.<m>.train.lr: [..]`, `Params.train_candidates`): one
training run per candidate learning rate, from the same initial weights and the same batches, and the best kept.

Which run is best is decided on the validation split, inside the cell's training (no extra stage): each run keeps its
own best epoch (the lowest validation FVU the model accepts, `pipeline.training.sparse.train_sparse`), and the runs
are compared by that epoch's validation FVU (`rank`). A run none of whose epochs the model accepted (an SAE that never
got as sparse as its target) ranks after every run that has one; ties go to the earlier candidate. Every run's
summary and per-epoch history go into the cell's training history (`Choice.record`), so what the choice was worth can
be read afterwards.

Resumption after a kill: each candidate checkpoints its epochs in its own folder `<work>/lr-<i>` and, once finished,
saves its model and history in `<work>/lr-<i>.done` together with the fingerprint of the cell's training inputs; a
rerun reuses every finished candidate whose fingerprint matches and resumes the interrupted one, so the outcome is
the same as an uninterrupted run's. A damaged finished candidate is trained again (with a warning).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.models.checkpoint import CheckpointError, load_model, read_config, save_model
from pipeline.records import write_json
from pipeline.training.loop import TrainResult
from pipeline.training.options import TrainSettings

log = logging.getLogger(__name__)

#: train one candidate: (its loop settings, the folder for its epoch checkpoints or None) -> the trained run
TrainOne = Callable[[TrainSettings, "Path | None"], TrainResult]

HISTORY_FILE = "history.json"


@dataclass(frozen=True)
class Choice:
    """The kept run of a learning-rate axis: its result, its settings, and the record of every run (`record`, merged
    into the cell's history.json: "lr" the kept candidate as given, "lr_axis" one summary per candidate with its
    per-epoch history)."""

    result: TrainResult
    settings: TrainSettings
    record: dict[str, Any]


def kept_epoch(result: TrainResult) -> dict[str, float]:
    """The history record of the epoch a run kept (its best accepted one; the last when none was accepted)."""
    return result.history[result.best_epoch - 1] if result.best_epoch > 0 else result.history[-1]


def rank(result: TrainResult) -> tuple[int, float]:
    """Sort key of a run, lower is better: (0 when the model accepted an epoch, else 1; that epoch's validation FVU)."""
    return (0 if result.best_epoch > 0 else 1, float(kept_epoch(result)["val_fvu"]))


def summary(settings: TrainSettings, result: TrainResult) -> dict[str, Any]:
    """One candidate's line in the record: its learning rate as given, the kept epoch's validation numbers, its history."""
    kept = kept_epoch(result)
    return {"lr": settings.lr, "val_fvu": kept["val_fvu"], "val_l0": kept.get("val_l0"), "best_epoch": result.best_epoch,
            "stopped_early": result.stopped_early, "history": result.history}


def train_lr_axis(candidates: Sequence[TrainSettings], train_one: TrainOne, work: Path | None = None, fingerprint: str = "") -> Choice:
    """Train every candidate (see the module docstring) and keep the best; `work` holds the epoch checkpoints (with
    one candidate, `work` itself, exactly as without an axis; None: in memory, nothing saved or resumed)."""
    if not candidates:
        raise ValueError("train_lr_axis: no candidate settings")
    if len(candidates) == 1:
        result = train_one(candidates[0], work)
        return Choice(result, candidates[0], {"lr": candidates[0].lr, "lr_axis": [summary(candidates[0], result)]})
    results = []
    for i, settings in enumerate(candidates):
        done = work / f"lr-{i}.done" if work is not None else None
        result = _finished(done, fingerprint, settings) if done is not None else None
        if result is None:
            log.info("learning-rate axis: candidate %d of %d, lr %s", i + 1, len(candidates), settings.lr)
            result = train_one(settings, work / f"lr-{i}" if work is not None else None)
            result.module.cpu()
            if done is not None:
                save_model(result.module, done, {"fingerprint": fingerprint, "lr": settings.lr})  # type: ignore[arg-type]
                write_json(done / HISTORY_FILE, {"history": result.history, "best_epoch": result.best_epoch, "stopped_early": result.stopped_early})
        results.append(result)
    best = min(range(len(results)), key=lambda i: rank(results[i]))
    log.info("learning-rate axis: kept lr %s (validation FVU %s)", candidates[best].lr,
             ", ".join(f"{s.lr}: {rank(r)[1]:.4g}" for s, r in zip(candidates, results)))
    record = {"lr": candidates[best].lr, "lr_axis": [summary(s, r) for s, r in zip(candidates, results)]}
    return Choice(results[best], candidates[best], record)


def _finished(done: Path, fingerprint: str, settings: TrainSettings) -> TrainResult | None:
    """The finished candidate saved in `done` when it was trained from the same inputs with the same settings' lr, else
    None (nothing there, other inputs, or damaged: a warning, and the candidate trains again)."""
    if not done.exists():
        return None
    try:
        provenance = read_config(done).get("provenance") or {}
        if provenance.get("fingerprint") != fingerprint or provenance.get("lr") != settings.lr:
            return None
        module = load_model(done)
        saved = json.loads((done / HISTORY_FILE).read_text())
        return TrainResult(module, saved["history"], int(saved["best_epoch"]), bool(saved["stopped_early"]))
    except (CheckpointError, OSError, KeyError, TypeError, ValueError) as e:
        log.warning("%s: finished candidate cannot be reused (%s); training it again", done, str(e).splitlines()[0])
        return None


__all__ = ["Choice", "TrainOne", "kept_epoch", "rank", "train_lr_axis"]
