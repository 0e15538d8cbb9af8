"""One streamed pass of a sparse model over rows of a store: FVU, mean L0 (K) and dead latents, the codes, and
anything else that streams (probes); and FVU against K.

Memory: one batch of embeddings, codes and reconstructions at a time, whatever the number of rows. The model runs on
its own device (the evaluation moves it to `evaluate.device`); batches travel there from pinned host memory and
only the non-zeros of the codes come back (`pipeline.models.base.tensor_csr`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from pipeline.metrics.reconstruction import ReconstructionAccumulator
from pipeline.models.base import SparseModel, half_axes, tensor_csr
from pipeline.scoring.codes import CodesWriter
from pipeline.store import Store
from pipeline.training.device import host_to_device

#: called once per batch with (source rows int64 (b,), x float32 (b, d), x_hat float32 (b, d))
OnBatch = Callable[[np.ndarray, np.ndarray, np.ndarray], None]


def model_device(model: SparseModel) -> torch.device:
    tensor = next(iter(model.parameters()), None)
    tensor = tensor if tensor is not None else next(iter(model.buffers()), None)
    return tensor.device if tensor is not None else torch.device("cpu")


@torch.no_grad()
def encode_rows(model: SparseModel, store: Store, rows: np.ndarray, batch_size: int, k: int | None = None,
                codes: CodesWriter | None = None, on_batch: OnBatch | None = None) -> dict[str, float]:
    """Stream `rows` (int64, ascending, unique) of `store` (n, d) through `model` at k (default its own) in batches:
    returns the dataset-level FVU, mean L0 and dead fraction over those rows; writes the latent codes
    (`SparseModel.latents`, CSR) to `codes` and calls `on_batch` when given."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) > 1 and not (np.diff(rows) > 0).all():
        raise ValueError("rows: expected ascending, unique row indices (the store is read in order)")
    device = model_device(model)
    acc = ReconstructionAccumulator(model.d, model.n_latents)
    start = 0
    for xb in store.iter_batches(batch_size, rows=rows):
        batch_rows = rows[start : start + len(xb)]
        start += len(xb)
        raw = model.encode(host_to_device(xb, device), k)
        x_hat = model.decode(raw).float().cpu().numpy()
        sparse_raw = tensor_csr(raw)
        acc.update(xb, x_hat, sparse_raw)
        if codes is not None:
            codes.append(batch_rows, half_axes(sparse_raw) if model.signed else sparse_raw)
        if on_batch is not None:
            on_batch(batch_rows, xb, x_hat)
    return asdict(acc.result())


def reconstruction(model: SparseModel, store: Store, rows: np.ndarray, batch_size: int, k: int | None = None) -> dict[str, float]:
    """Streaming FVU / L0 / dead fraction of `model` (at k, default its own) over `rows` of `store` (n, d)."""
    return encode_rows(model, store, rows, batch_size, k)


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
