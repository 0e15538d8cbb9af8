"""Reconstruction scores of a sparse model streamed over a store: FVU, mean L0 (K) and dead latents, and FVU vs K."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from pipeline.metrics.reconstruction import ReconstructionAccumulator
from pipeline.models.base import SparseModel
from pipeline.store import Store


@torch.no_grad()
def reconstruction(model: SparseModel, store: Store, rows: np.ndarray, batch_size: int, k: int | None = None) -> dict[str, float]:
    """Streaming FVU / L0 / dead fraction of `model` (at k, default its own) over `rows` of `store` (n, d)."""
    acc = ReconstructionAccumulator(model.d, model.n_latents)
    for xb in store.iter_batches(batch_size, rows=rows):
        codes = model.encode(torch.as_tensor(xb, dtype=torch.float32), k)
        acc.update(xb.astype(np.float64), model.decode(codes).numpy().astype(np.float64), codes.numpy())
    return asdict(acc.result())


def fvu_curve(models: dict[str, SparseModel], store: Store, rows: np.ndarray, batch_size: int, ks: list[int]) -> list[dict[str, Any]]:
    """FVU against K for each named model at every k of `ks` (k <= d; one rotation serves every k): one point
    {"model", "k", "K" (measured mean L0), "fvu"} per model and k."""
    points = []
    for k in ks:
        for name, model in models.items():
            if k <= model.n_latents:
                stats = reconstruction(model, store, rows, batch_size, k=k)
                points.append({"model": name, "k": k, "K": stats["l0"], "fvu": stats["fvu"]})
    return points
