"""One streamed pass of a sparse model over rows of a store: FVU, mean L0 (K) and dead latents, the codes, and
anything else that streams (probes); and FVU against K. A pass whose reconstructions nothing reads (the evaluation's
matching rows and pairs) only encodes: decoding costs as much as encoding for a dense SAE decoder.

Memory: one batch of embeddings, codes and reconstructions at a time, whatever the number of rows. The model runs on
its own device (the evaluation moves it to `evaluate.device`); batches travel there from pinned host memory and
only the non-zeros of the codes come back (`pipeline.models.base.tensor_csr`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.metrics.reconstruction import ReconstructionAccumulator, ReconstructionStats
from pipeline.models.base import SparseModel, half_axes, tensor_csr
from pipeline.scoring.codes import CodesWriter
from pipeline.store import Store
from pipeline.training.device import host_to_device

#: called once per batch with (source rows int64 (b,), x float32 (b, d), x_hat float32 (b, d))
OnBatch = Callable[[np.ndarray, np.ndarray, np.ndarray], None]


@dataclass(frozen=True)
class CurvePoint:
    """One point of the FVU-vs-K curve: a model ("trained" or "untrained") sparsified at k, its measured mean L0 (K)
    and FVU."""

    model: str
    k: int
    K: float
    fvu: float


def model_device(model: SparseModel) -> torch.device:
    tensor = next(iter(model.parameters()), None)
    tensor = tensor if tensor is not None else next(iter(model.buffers()), None)
    return tensor.device if tensor is not None else torch.device("cpu")


@torch.no_grad()
def encode_rows(model: SparseModel, store: Store, rows: np.ndarray, batch_size: int, k: int | None = None,
                codes: CodesWriter | None = None, on_batch: OnBatch | None = None, reconstruct: bool = True) -> ReconstructionStats | None:
    """Stream `rows` (int64, ascending, unique) of `store` (n, d) through `model` at k (default its own) in batches:
    returns the dataset-level FVU, mean L0 and dead fraction over those rows; writes the latent codes
    (`SparseModel.latents`, CSR) to `codes` and calls `on_batch` when given. reconstruct=False: codes only (no
    decoding, no statistics, no `on_batch`; returns None), for row sets whose reconstructions nothing reads."""
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
        sparse_raw = tensor_csr(raw)
        if codes is not None:
            codes.append(batch_rows, half_axes(sparse_raw) if model.signed else sparse_raw)
        if not reconstruct:
            continue
        x_hat = model.decode_sparse(raw).float().cpu().numpy()
        acc.update(xb, x_hat, sparse_raw)
        if on_batch is not None:
            on_batch(batch_rows, xb, x_hat)
    return acc.result() if reconstruct else None


def reconstruction(model: SparseModel, store: Store, rows: np.ndarray, batch_size: int, k: int | None = None) -> ReconstructionStats:
    """Streaming FVU / L0 / dead fraction of `model` (at k, default its own) over `rows` of `store` (n, d)."""
    return encode_rows(model, store, rows, batch_size, k)


def fvu_curve(models: dict[str, SparseModel], store: Store, rows: np.ndarray, batch_size: int, ks: list[int]) -> list[CurvePoint]:
    """FVU against K for each named model at every k of `ks` (k <= d; one rotation serves every k): one point per
    model and k."""
    points = []
    for k in ks:
        for name, model in models.items():
            if k <= model.n_latents:
                stats = reconstruction(model, store, rows, batch_size, k=k)
                points.append(CurvePoint(name, k, stats.l0, stats.fvu))
    return points
