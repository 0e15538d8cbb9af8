"""The linear probes of every kind on disk: the probes stage writes them once per dataset, every cell's evaluation
reads them.

A kind's probes are fitted on the dense embeddings of its matching rows (`pipeline.scoring.cell_evaluation.fit_kind_probes`):
nothing about them depends on a sparse model, so one fit serves every cell of a sweep instead of one per cell.
Layout of store/probes/:

    probes.safetensors   per kind that has probes: "<kind>.weight" float64 (d, K), "<kind>.bias" float64 (K,),
                         "<kind>.columns" int64 (F, K_max), "<kind>.real" bool (F, K_max) (`pipeline.metrics.probe.Probes`)
    probes.json          per kind: null (no one-hot family: no probe) or its classes per family and its L-BFGS
                         iterations; and the fingerprint of the fit (rows, families, seed, row cap, solver, source store),
                         which an evaluation compares with its own before it scores anything
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from pipeline.metrics.probe import Probes
from pipeline.records import write_json

TENSORS = "probes.safetensors"
META = "probes.json"
_FIELDS = ("weight", "bias", "columns", "real")


@dataclass(frozen=True)
class FittedProbes:
    """Per kind its probes (None: the kind has no one-hot family), and the fingerprint of what they were fitted on
    (JSON-ready: kind -> its inputs)."""

    probes: Mapping[str, Probes | None]
    fingerprint: Mapping[str, Any]


def save_probes(folder: str | Path, fitted: FittedProbes) -> None:
    """Write `fitted` into `folder` (created; the caller makes it atomic)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"{kind}.{field}": getattr(p, field).detach().cpu().contiguous() for kind, p in fitted.probes.items() if p is not None
               for field in _FIELDS}
    save_file(tensors, str(folder / TENSORS))
    kinds = {kind: None if p is None else {"classes": [c.tolist() for c in p.classes], "iterations": p.iterations}
             for kind, p in fitted.probes.items()}
    write_json(folder / META, {"kinds": kinds, "fingerprint": fitted.fingerprint})


def load_probes(folder: str | Path, device: str | torch.device = "cpu") -> FittedProbes:
    """The probes written by `save_probes`, their tensors on `device`. A missing or inconsistent folder is a
    ValueError/FileNotFoundError that names it and the stage that writes it."""
    folder = Path(folder)
    meta_path, tensors_path = folder / META, folder / TENSORS
    for path in (meta_path, tensors_path):
        if not path.exists():
            raise FileNotFoundError(f"{path}: missing; the probes stage writes it (dvc repro probes, or python -m stages.probes)")
    try:
        meta = json.loads(meta_path.read_text())
        kinds, fingerprint = meta["kinds"], meta["fingerprint"]
        tensors = load_file(str(tensors_path), device=str(device))
        probes: dict[str, Probes | None] = {}
        for kind, record in kinds.items():
            if record is None:
                probes[kind] = None
                continue
            probes[kind] = Probes(classes=tuple(np.asarray(c, dtype=np.int64) for c in record["classes"]),
                                  **{field: tensors[f"{kind}.{field}"] for field in _FIELDS}, iterations=int(record["iterations"]))
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as error:
        raise ValueError(f"{folder}: unreadable probes ({type(error).__name__}: {error}); rerun the probes stage (dvc repro probes)") from error
    return FittedProbes(probes=probes, fingerprint=fingerprint)
