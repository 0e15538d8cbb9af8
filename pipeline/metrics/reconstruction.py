"""Reconstruction metrics: FVU, L0 (the "K" of FVU-vs-K curves) and dead latents.

docs/science.md §3: FVU is dataset-level, `sum ||x - x^||^2 / sum ||x - mean(x)||^2`, accumulated in
float64. `ReconstructionAccumulator` computes the same numbers batch by batch for stores larger
than memory. Codes (for L0 and dead latents) may be dense or any scipy.sparse matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse

from pipeline.metrics.csr import column_counts, to_csr


def _check_2d(name: str, array: np.ndarray, numeric: bool = True) -> np.ndarray:
    """Return `array` as an ndarray after checking it is 2-D, non-empty and (if numeric) finite."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array, got {type(array).__name__}")
    if array.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D array (n, features), got shape {array.shape}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"{name}: expected a non-empty array, got shape {array.shape}")
    if numeric:
        if array.dtype.kind not in "fiub":
            raise TypeError(f"{name}: expected a numeric array, got dtype {array.dtype}")
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise ValueError(f"{name}: contains NaN or infinite values")
    return array


def _check_pair(x: np.ndarray, x_hat: np.ndarray) -> None:
    _check_2d("x", x)
    _check_2d("x_hat", x_hat)
    if x.shape != x_hat.shape:
        raise ValueError(f"x_hat: expected the shape of x {x.shape}, got {x_hat.shape}")


def fvu(x: np.ndarray, x_hat: np.ndarray) -> float:
    """Fraction of variance unexplained, dataset level, in float64.

    x, x_hat: (n, d) float arrays (any float dtype; promoted to float64).
    Returns `sum ||x - x^||^2 / sum ||x - mean(x)||^2` with `mean(x)` the (d,) mean row.
    Raises ValueError when x has zero total variance (FVU is undefined then).
    """
    _check_pair(x, x_hat)
    x64 = x.astype(np.float64, copy=False)
    err = float(np.sum((x64 - x_hat.astype(np.float64, copy=False)) ** 2))
    var = float(np.sum((x64 - x64.mean(axis=0)) ** 2))
    if var <= 0.0:
        raise ValueError("x: has zero total variance, FVU is undefined")
    return err / var


def _codes(codes: np.ndarray | sparse.sparray | sparse.spmatrix) -> sparse.csr_array:
    """Codes (n, n_latents), dense or sparse, as CSR with only the non-zeros stored (finite values checked)."""
    if not sparse.issparse(codes):
        _check_2d("codes", codes)
    x = to_csr("codes", codes)
    if x.dtype.kind == "f" and not np.isfinite(x.data).all():
        raise ValueError("codes: contains NaN or infinite values")
    return x


def l0(codes: np.ndarray | sparse.sparray | sparse.spmatrix) -> float:
    """Mean number of non-zero entries per row of `codes` (n, n_latents), dense or sparse: the K of FVU-vs-K."""
    x = _codes(codes)
    return x.nnz / x.shape[0]


def dead_fraction(codes: np.ndarray | sparse.sparray | sparse.spmatrix) -> float:
    """Fraction of columns of `codes` (n, n_latents), dense or sparse, that are never non-zero on these rows."""
    ever = column_counts(_codes(codes)) > 0
    return np.count_nonzero(~ever) / ever.size


@dataclass(frozen=True)
class ReconstructionStats:
    """Dataset-level reconstruction summary. `n` is the number of rows seen."""

    fvu: float
    l0: float
    dead_fraction: float
    n: int


class ReconstructionAccumulator:
    """Streaming FVU / L0 / dead fraction over batches, in float64.

    FVU needs the dataset mean, unknown until the end. We keep, in float64, the sum of squared
    errors, and — shifted by a fixed centre `c` (the first batch's mean) — `s1 = sum (x - c)` and
    `s2 = sum ||x - c||^2`. Then `sum ||x - mean||^2 = s2 - ||s1||^2 / n` exactly in real
    arithmetic. The shift matters: without it (c = 0) that difference subtracts two numbers of
    size `n ||mean||^2`, and for embeddings whose mean is large compared with their spread
    (CLIP embeddings are far from the origin) the cancellation loses most significant digits.
    With c near the mean both terms are of the size of the variance itself.
    """

    def __init__(self, d: int, n_latents: int) -> None:
        if not isinstance(d, (int, np.integer)) or d <= 0:
            raise ValueError(f"d: expected a positive int, got {d!r}")
        if not isinstance(n_latents, (int, np.integer)) or n_latents <= 0:
            raise ValueError(f"n_latents: expected a positive int, got {n_latents!r}")
        self.d = int(d)
        self.n_latents = int(n_latents)
        self._n = 0
        self._sse = 0.0
        self._centre: np.ndarray | None = None
        self._s1 = np.zeros(self.d, dtype=np.float64)
        self._s2 = 0.0
        self._nnz = 0
        self._ever_active = np.zeros(self.n_latents, dtype=bool)

    def update(self, x: np.ndarray, x_hat: np.ndarray, codes: np.ndarray | sparse.sparray | sparse.spmatrix) -> None:
        """Add one batch: x, x_hat (b, d) floats; codes (b, n_latents), dense or sparse."""
        _check_pair(x, x_hat)
        codes = _codes(codes)
        if x.shape[1] != self.d:
            raise ValueError(f"x: expected {self.d} columns, got shape {x.shape}")
        if codes.shape != (x.shape[0], self.n_latents):
            raise ValueError(f"codes: expected shape {(x.shape[0], self.n_latents)}, got {codes.shape}")
        x64 = x.astype(np.float64, copy=False)
        if self._centre is None:
            self._centre = x64.mean(axis=0)
        shifted = x64 - self._centre
        self._sse += float(np.sum((x64 - x_hat.astype(np.float64, copy=False)) ** 2))
        self._s1 += shifted.sum(axis=0)
        self._s2 += float(np.sum(shifted**2))
        self._n += x.shape[0]
        self._nnz += int(codes.nnz)
        self._ever_active |= column_counts(codes) > 0

    def result(self) -> ReconstructionStats:
        """The statistics over every batch so far. Raises ValueError before any batch or at zero variance."""
        if self._n == 0:
            raise ValueError("ReconstructionAccumulator: no batch was added")
        var = self._s2 - float(self._s1 @ self._s1) / self._n
        if var <= 0.0:
            raise ValueError("x: has zero total variance, FVU is undefined")
        return ReconstructionStats(
            fvu=self._sse / var,
            l0=self._nnz / self._n,
            dead_fraction=np.count_nonzero(~self._ever_active) / self.n_latents,
            n=self._n,
        )
