"""Tests for pipeline.metrics.cknna: unbiased HSIC, kNN masks, CKNNA values and invariances."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import sparse

from pipeline.metrics.cknna import _knn_mask, cknna, hsic_unbiased

# Items {0,1} and {2,3} are neighbours under A; {0,2} and {1,3} under B.
A = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
B = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])


def test_hsic_unbiased_hand_computed() -> None:
    k = A @ A.T  # off-diagonal: pairs (0,1), (2,3)
    l_mat = B @ B.T  # off-diagonal: pairs (0,2), (1,3)
    # K vs K: tr = 4, (1'K1)^2/((n-1)(n-2)) = 16/6, 2 1'KK1/(n-2) = 2*4/2 = 4 -> (4 + 8/3 - 4)/(4*1) = 2/3
    assert hsic_unbiased(k, k) == pytest.approx(2 / 3, abs=1e-15)
    # K vs L: tr = 0 -> (0 + 8/3 - 4)/4 = -1/3
    assert hsic_unbiased(k, l_mat) == pytest.approx(-1 / 3, abs=1e-15)
    # A constant kernel carries no information: HSIC 0.
    assert hsic_unbiased(np.ones((4, 4)), k) == pytest.approx(0.0, abs=1e-15)


def test_knn_mask_excludes_diagonal_and_breaks_ties_to_lower_index() -> None:
    mask = _knn_mask(A @ A.T, 2)
    # Row 0: column 1 (value 1), then columns 2 and 3 tie at 0 -> column 2.
    assert mask[0].tolist() == [False, True, True, False]
    assert mask[3].tolist() == [True, False, True, False]
    assert not mask.diagonal().any()
    assert (mask.sum(axis=1) == 2).all()


def test_knn_mask_keeps_what_a_stable_sort_keeps_on_kernels_full_of_ties() -> None:
    """The partition-based mask against the definition (a stable sort's first k off-diagonal entries per row) on small
    integer kernels, where the k-th value is tied in most rows."""
    rng = np.random.default_rng(0)
    for _ in range(100):
        n = int(rng.integers(2, 30))
        k = int(rng.integers(1, n))
        x = rng.integers(0, 3, size=(n, 3)).astype(np.float64)
        kernel = x @ x.T
        scores = kernel.copy()
        np.fill_diagonal(scores, -np.inf)
        expected = np.zeros((n, n), dtype=bool)
        np.put_along_axis(expected, np.argsort(-scores, axis=1, kind="stable")[:, :k], True, axis=1)
        assert np.array_equal(_knn_mask(kernel, k), expected), (n, k)


def test_cknna_hand_computed_full_and_disjoint_neighbourhoods() -> None:
    # k = n - 1 keeps every off-diagonal pair: CKNNA = (-1/3) / sqrt(2/3 * 2/3) = -1/2.
    assert cknna(A, B, k=3) == pytest.approx(-0.5, abs=1e-12)
    # k = 1: A's neighbour of 0 is 1, B's is 2: no mutual pair, s(K, L) = 0 while s(K,K) = s(L,L) = 2/3.
    assert cknna(A, B, k=1) == 0.0
    assert cknna(A, A, k=1) == pytest.approx(1.0, abs=1e-12)


def test_cknna_of_identical_inputs_is_one_and_scale_invariant() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(120, 16))
    assert cknna(a, a, k=10) == pytest.approx(1.0, abs=1e-12)
    assert cknna(a, 3.0 * a, k=10) == pytest.approx(1.0, abs=1e-12)


def test_cknna_invariant_to_orthogonal_rotation() -> None:
    rng = np.random.default_rng(1)
    a = rng.normal(size=(150, 12))
    b = a @ rng.normal(size=(12, 20)) + 0.5 * rng.normal(size=(150, 20))
    q, _ = np.linalg.qr(rng.normal(size=(12, 12)))
    base = cknna(a, b, k=10)
    assert 0.2 < base < 1.0
    assert cknna(a @ q, b, k=10) == pytest.approx(base, abs=1e-9)


def test_cknna_related_above_unrelated() -> None:
    rng = np.random.default_rng(2)
    a = rng.normal(size=(300, 8))
    related = a + 0.1 * rng.normal(size=(300, 8))
    unrelated = rng.normal(size=(300, 8))
    assert cknna(a, related, k=10) > 0.5
    assert abs(cknna(a, unrelated, k=10)) < 0.1


def test_cknna_subsample_is_seeded_and_uses_the_same_rows() -> None:
    rng = np.random.default_rng(3)
    a = rng.normal(size=(80, 5))
    b = a + 0.3 * rng.normal(size=(80, 5))
    rows = np.sort(np.random.default_rng(7).choice(80, size=40, replace=False))
    value = cknna(a, b, k=5, max_n=40, seed=7)
    assert value == cknna(a[rows], b[rows], k=5, max_n=None)
    assert value == cknna(a, b, k=5, max_n=40, seed=7)
    assert cknna(a, b, k=5, max_n=80) == cknna(a, b, k=5, max_n=None)


def test_bad_inputs_raise_clear_errors() -> None:
    a = np.ones((10, 3))
    with pytest.raises(ValueError, match="rows"):
        cknna(a, np.ones((9, 3)))
    with pytest.raises(ValueError, match="k:"):
        cknna(a, a, k=10)
    with pytest.raises(ValueError, match="k:"):
        cknna(a, a, k=0)
    with pytest.raises(ValueError, match="at least 4"):
        cknna(a[:3], a[:3], k=1)
    bad = a.copy()
    bad[0, 0] = np.inf
    with pytest.raises(ValueError, match="NaN"):
        cknna(bad, a, k=2)
    with pytest.raises(ValueError, match="2-D"):
        cknna(np.ones(10), a)
    with pytest.raises(ValueError, match="max_n"):
        cknna(a, a, k=2, max_n=2)


def test_masked_similarity_on_the_masks_entries_equals_the_dense_formula() -> None:
    """s(K, L) is computed on the mutual neighbours only (sparse): the same number as `hsic_unbiased` of the dense
    masked kernels, for a mask with and without reciprocal pairs."""
    from pipeline.metrics.cknna import _masked_similarity

    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(40, 6)), rng.normal(size=(40, 5))
    k_mat, l_mat = a @ a.T, b @ b.T
    for k in (1, 5, 20):
        mask_k, mask_l = _knn_mask(k_mat, k), _knn_mask(l_mat, k)
        mask = mask_k & mask_l
        dense = hsic_unbiased(np.where(mask, k_mat, 0.0), np.where(mask, l_mat, 0.0))
        assert _masked_similarity(k_mat, l_mat, mask_k, mask_l) == pytest.approx(dense, rel=1e-12, abs=1e-15)
        assert _masked_similarity(k_mat, k_mat, mask_k, mask_k) == pytest.approx(hsic_unbiased(np.where(mask_k, k_mat, 0.0), np.where(mask_k, k_mat, 0.0)), rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_side_computed_once_gives_cknna_against_every_other(seed: int) -> None:
    """`knn_kernel` + `aligned` are `cknna` split in two: one side reused against several representations (dense and
    sparse) gives exactly cknna's number for each, and the side's self-similarity is s(K, K) on its own mask."""
    from pipeline.metrics.cknna import aligned, knn_kernel

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(60, 8))
    side = knn_kernel(x, 5)
    assert side.self_similarity == pytest.approx(hsic_unbiased(np.where(side.mask, x @ x.T, 0.0), np.where(side.mask, x @ x.T, 0.0)), rel=1e-12)
    for other in (rng.normal(size=(60, 3)), np.maximum(x @ rng.normal(size=(8, 20)), 0.0), x):
        assert aligned(knn_kernel(other, 5), side) == cknna(other, x, k=5, max_n=None)
        codes = sparse.csr_array(np.round(other * 4) / 4)  # binary fractions: the sparse kernel is exact
        assert aligned(knn_kernel(codes, 5), side) == cknna(codes.toarray(), x, k=5, max_n=None)
    assert aligned(side, side) == pytest.approx(1.0, abs=1e-12)


def test_sides_of_other_items_or_another_k_are_refused() -> None:
    from pipeline.metrics.cknna import aligned, knn_kernel

    x = np.random.default_rng(0).normal(size=(20, 4))
    with pytest.raises(ValueError, match="same items"):
        aligned(knn_kernel(x, 3), knn_kernel(x[:19], 3))
    with pytest.raises(ValueError, match="same k"):
        aligned(knn_kernel(x, 3), knn_kernel(x, 4))
    with pytest.raises(ValueError, match="codes: CKNNA needs at least 4 rows"):
        knn_kernel(x[:3], 1, "codes")
    with pytest.raises(ValueError, match="k:"):
        knn_kernel(x, 20)
