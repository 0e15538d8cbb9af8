"""Sparse codes as the metrics take them: a scipy.sparse CSR matrix (n, L), one row per item.

A k-sparse code of n items over L latents is (indices, values) per row; at ImageNet scale (1.28 M rows, 16,384
latents) a dense float32 copy would be 84 GB while the CSR form is n * k * 8 bytes. Every concept metric that takes
an (n, L) array of codes or binarised codes (`matching`, `tapas`, `fms`, `cknna`, `reconstruction`) also takes any
scipy.sparse matrix or array of the same shape and gives the same numbers; internally they work on the canonical
CSR form this module builds (sorted column indices, no duplicates, no stored zeros), so a dense input and its sparse
copy go through the same arithmetic.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import sparse


def is_sparse(x: Any) -> bool:
    """Whether `x` is a scipy.sparse matrix or array."""
    return sparse.issparse(x)


def to_csr(name: str, x: Any, dtype: Any = None, allow_empty: bool = False) -> sparse.csr_array:
    """`x` (a dense numpy array or any scipy.sparse matrix/array, 2-D and non-empty) as a canonical CSR array:
    sorted indices, duplicates summed, explicit zeros removed; `dtype` converts the values (None keeps them).
    allow_empty: accept 0 rows (metrics need rows; converting an empty batch does not).

    Raises TypeError for anything else (a list, a torch tensor) and ValueError for a wrong shape, naming `name`."""
    if sparse.issparse(x):
        if x.ndim != 2:
            raise ValueError(f"{name}: expected a 2-D sparse matrix (n, L), got {x.ndim} dimensions")
        out = sparse.csr_array(x, dtype=dtype, copy=True)
    elif isinstance(x, np.ndarray):
        if x.ndim != 2:
            raise ValueError(f"{name}: expected a 2-D array (n, L), got shape {x.shape}")
        out = sparse.csr_array(x if dtype is None else x.astype(dtype, copy=False))
    else:
        raise TypeError(f"{name}: expected a numpy array or a scipy.sparse matrix, got {type(x).__name__}")
    if (out.shape[0] == 0 and not allow_empty) or out.shape[1] == 0:
        raise ValueError(f"{name}: expected a non-empty 2-D array (n, L), got shape {out.shape}")
    out.sum_duplicates()  # also sorts the indices
    out.eliminate_zeros()
    return out


def row_of_entries(x: sparse.csr_array) -> np.ndarray:
    """int64 (nnz,): the row of every stored entry of a CSR matrix (its coordinate form's row array)."""
    return np.repeat(np.arange(x.shape[0], dtype=np.int64), np.diff(x.indptr))


def first_non_finite(x: sparse.csr_array) -> tuple[int, int, float] | None:
    """(row, column, value) of the first stored NaN or infinity of a float CSR matrix, or None."""
    if x.dtype.kind != "f":
        return None
    bad = np.flatnonzero(~np.isfinite(x.data))
    if bad.size == 0:
        return None
    row = int(np.searchsorted(x.indptr, bad[0], side="right") - 1)
    return row, int(x.indices[bad[0]]), float(x.data[bad[0]])


def column_counts(x: sparse.csr_array) -> np.ndarray:
    """int64 (L,): stored (non-zero) entries per column."""
    return np.bincount(x.indices, minlength=x.shape[1]).astype(np.int64)


def stack_rows(blocks: list[sparse.csr_array], n_columns: int) -> sparse.csr_array:
    """Row blocks (each (b_i, n_columns)) stacked into one CSR matrix; an empty list gives (0, n_columns)."""
    if not blocks:
        return sparse.csr_array((0, n_columns), dtype=np.float32)
    return sparse.csr_array(sparse.vstack([sparse.csr_array(b) for b in blocks], format="csr"))
