"""CKNNA: centred kernel nearest-neighbour alignment (Huh et al. 2024; docs/science.md §3).

Linear kernels K = A A^T and L = B B^T over the same n items. Each row keeps its k nearest
neighbours under a kernel (largest kernel values, the diagonal excluded). Similarity between two
kernels = unbiased HSIC of the kernels restricted to the pairs that are neighbours under *both*:

    HSIC_u(K, L) = [tr(K L) + (1'K1)(1'L1)/((n-1)(n-2)) - 2 1'K L 1/(n-2)] / (n(n-3))

computed on the masked kernels with zeroed diagonals, and

    CKNNA = s(K, L) / sqrt(s(K, K) s(L, L)).

Which mask enters s(K, K) and s(L, L): we follow the published implementation (the `cknna`
alignment metric of the platonic-representation repository, `similarity(K, K, topk)`): every
s(., .) builds its own mutual-kNN mask from the two kernels it compares. So s(K, K) uses K's own
kNN mask (the intersection of K's neighbourhoods with themselves) and s(L, L) uses L's own
mask; only s(K, L) uses the mutual mask. This makes CKNNA(a, a) = 1 exactly.
Other choices, also as published: the mask is per row (not symmetrised), neighbours are taken
on the kernel value (inner product, not a distance), both in float64 here. Two deviations,
both documented: ties between equal kernel values go to the lower column index (a stable sort;
the published torch.topk leaves ties unspecified), and there is no `+1e-6` in the denominator —
when s(K, K) s(L, L) <= 0 the result is NaN (logged) instead of a silently shrunken number.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from scipy import sparse

from pipeline.metrics.csr import is_sparse, to_csr
from pipeline.records import Undefined

logger = logging.getLogger(__name__)

#: rows of one representation: a dense numpy array or a scipy.sparse matrix (n, dim)
Rows = np.ndarray | sparse.sparray | sparse.spmatrix


def _rows(x: Rows, rows: np.ndarray) -> Rows:
    return sparse.csr_array(x)[rows] if is_sparse(x) else x[rows]


def _check(name: str, array: np.ndarray | sparse.sparray | sparse.spmatrix) -> None:
    if not (isinstance(array, np.ndarray) or is_sparse(array)):
        raise TypeError(f"{name}: expected a numpy array or a scipy.sparse matrix, got {type(array).__name__}")
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"{name}: expected a non-empty 2-D array (n, dim), got shape {array.shape}")
    if array.dtype.kind not in "fiub":
        raise TypeError(f"{name}: expected a numeric array, got dtype {array.dtype}")
    values = to_csr(name, array).data if is_sparse(array) else array
    if array.dtype.kind == "f" and not np.isfinite(values).all():
        raise ValueError(f"{name}: contains NaN or infinite values")


def _gram(x: np.ndarray | sparse.csr_array) -> np.ndarray:
    """(n, n) float64 linear kernel x x^T of the (already subsampled) rows; a sparse x stays sparse until the
    (n, n) result, so its cost is the products of the rows' non-zeros and no (n, L) dense copy is made."""
    if is_sparse(x):
        x64 = x.astype(np.float64)
        return np.asarray((x64 @ x64.T).toarray())
    x64 = x.astype(np.float64, copy=False)
    return x64 @ x64.T


def _knn_mask(kernel: np.ndarray, k: int) -> np.ndarray:
    """(n, n) bool: True at the k largest off-diagonal entries of each row (ties: lower index)."""
    scores = kernel.copy()
    np.fill_diagonal(scores, -np.inf)
    # the k-th largest value of each row (torch's top-k: a value, so how it breaks ties does not matter; several times
    # faster than numpy's partition), then every larger entry and, of the entries equal to it, the lowest-indexed
    # ones that complete k: what a stable sort's first k would keep
    kth = torch.topk(torch.from_numpy(scores), k, dim=1).values[:, k - 1 :].numpy()
    mask = scores > kth
    tied = scores == kth
    room = k - mask.sum(axis=1, keepdims=True)
    crowded = np.flatnonzero(tied.sum(axis=1) > room[:, 0])  # rows where more entries equal the k-th than fit
    mask |= tied
    if crowded.size:
        mask[crowded] &= (scores[crowded] > kth[crowded]) | (np.cumsum(tied[crowded], axis=1) <= room[crowded])
    return mask


def hsic_unbiased(k_mat: np.ndarray, l_mat: np.ndarray) -> float:
    """Unbiased HSIC (Song et al. 2012) of two (n, n) kernels; diagonals are zeroed first. O(n^2).

    Uses tr(K L) = sum(K * L^T) and 1'K L 1 = (1'K)(L 1), so no n^3 matrix product is formed.
    """
    n = k_mat.shape[0]
    if n < 4:
        raise ValueError(f"n: unbiased HSIC needs at least 4 items, got {n}")
    kt = k_mat.astype(np.float64, copy=True)
    lt = l_mat.astype(np.float64, copy=True)
    np.fill_diagonal(kt, 0.0)
    np.fill_diagonal(lt, 0.0)
    return _hsic(float(np.sum(kt * lt.T)), float(kt.sum()), float(lt.sum()), float(kt.sum(axis=0) @ lt.sum(axis=1)), n)


def _hsic(trace_kl: float, sum_k: float, sum_l: float, one_kl_one: float, n: int) -> float:
    """Unbiased HSIC from its terms: tr(K L), 1'K1, 1'L1, 1'K L 1 of (n, n) kernels with zeroed diagonals."""
    value = trace_kl + sum_k * sum_l / ((n - 1) * (n - 2)) - 2.0 * one_kl_one / (n - 2)
    return value / (n * (n - 3))


def _masked_similarity(k_mat: np.ndarray, l_mat: np.ndarray, mask_k: np.ndarray, mask_l: np.ndarray) -> float:
    """`hsic_unbiased` of the two kernels restricted to the mask both keep (the diagonal never is a neighbour): on the
    mask's entries only (at most k per row), as sparse matrices, with the same terms as the dense formula."""
    n = k_mat.shape[0]
    rows, cols = np.nonzero(mask_k & mask_l)
    kt = sparse.csr_array((k_mat[rows, cols], (rows, cols)), shape=(n, n))
    lt = sparse.csr_array((l_mat[rows, cols], (rows, cols)), shape=(n, n))
    return _hsic(float(kt.multiply(lt.T).sum()), float(kt.sum()), float(lt.sum()), float(np.asarray(kt.sum(axis=0)) @ np.asarray(lt.sum(axis=1))), n)


def cknna_subsample(n: int, max_n: int | None, seed: int) -> np.ndarray:
    """int64 positions of the rows `cknna` uses out of n: all when n <= max_n (or max_n is None), else a seeded
    sorted subset of max_n (a caller that reads rows from disk can read only these and pass max_n=None)."""
    if max_n is None or n <= max_n:
        return np.arange(n, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(n, size=max_n, replace=False)).astype(np.int64)


@dataclass(frozen=True)
class KnnKernel:
    """One representation's side of CKNNA over n items, reusable against every other representation of the same items
    (e.g. the embeddings against the codes of several models): kernel float64 (n, n), the linear kernel; mask bool
    (n, n), each row's k nearest neighbours under it; k; self_similarity, s(K, K) on its own mask."""

    kernel: np.ndarray
    mask: np.ndarray
    k: int
    self_similarity: float


def knn_kernel(x: Rows, k: int = 10, name: str = "x") -> KnnKernel:
    """The CKNNA side of x (n, dim), a numeric array or a scipy.sparse matrix (all its rows: subsample first), with k
    neighbours per row, 1 <= k <= n - 1. `name` names x in errors."""
    _check(name, x)
    n = x.shape[0]
    if n < 4:
        raise ValueError(f"{name}: CKNNA needs at least 4 rows, got {n}")
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= n - 1:
        raise ValueError(f"k: expected an int in [1, {n - 1}] (n - 1 neighbours exist), got {k!r}")
    kernel = _gram(to_csr(name, x) if is_sparse(x) else x)
    mask = _knn_mask(kernel, k)
    return KnnKernel(kernel, mask, int(k), _masked_similarity(kernel, kernel, mask, mask))


def aligned(a: KnnKernel, b: KnnKernel) -> float:
    """CKNNA of two sides of the same n items with the same k: s(K, L) / sqrt(s(K, K) s(L, L)), NaN (logged) when
    the self-similarity product is not positive."""
    if a.kernel.shape != b.kernel.shape:
        raise ValueError(f"b: a kernel over {b.kernel.shape[0]} items where a has {a.kernel.shape[0]}; both must be the same items")
    if a.k != b.k:
        raise ValueError(f"b: {b.k} neighbours per row where a has {a.k}; both sides must use the same k")
    denom = a.self_similarity * b.self_similarity
    if not denom > 0.0:
        logger.warning("cknna: self-similarity product %.3g is not positive; returning NaN", denom)
        return Undefined(f"self-similarity product {denom:.3g} is not positive (constant codes or embeddings)")
    return float(_masked_similarity(a.kernel, b.kernel, a.mask, b.mask) / np.sqrt(denom))


def cknna(a: Rows, b: Rows, k: int = 10, max_n: int | None = 2000, seed: int = 0) -> float:
    """CKNNA between two representations of the same items.

    a: (n, d_a), b: (n, d_b) numeric arrays, row i of both = item i (e.g. codes or
    reconstructions vs the embeddings); either may be a scipy.sparse matrix (k-sparse codes). The kernels of a
    sparse input are computed from its non-zeros after the subsampling; they equal the dense kernels exactly
    whenever the products are exact in float64 (e.g. codes on a grid of binary fractions), and to float64
    rounding otherwise (a sum in another order), which can reorder two near-equal neighbours. k: neighbours per row, 1 <= k <= n - 1 (after
    subsampling). max_n: when n > max_n, a random subset of max_n rows (the same for a and b,
    drawn with `seed`) is used, because the metric is O(n^2) in time and memory; None = all rows.
    Returns a float in [-1, 1] in practice (NaN when a self-similarity is not positive).
    `knn_kernel` and `aligned` are its two halves, for a side that is compared with several others.
    """
    _check("a", a)
    _check("b", b)
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"b: expected {a.shape[0]} rows like a, got shape {b.shape}")
    if max_n is not None and (not isinstance(max_n, (int, np.integer)) or max_n < 4):
        raise ValueError(f"max_n: expected None or an int >= 4, got {max_n!r}")
    if max_n is not None and a.shape[0] > max_n:
        rows = cknna_subsample(a.shape[0], max_n, seed)
        a, b = _rows(a, rows), _rows(b, rows)
    return aligned(knn_kernel(a, k, "a"), knn_kernel(b, k, "b"))
