"""Sparse codes through every metric: a scipy.sparse input gives exactly the numbers of its dense copy.

Hand-checked cases (the hand cases of the dense tests, given as CSR/CSC/COO) and random cases (several seeds, shapes
and densities, with empty rows, never-active latents and ties) for binarise, one-to-one, FBMP, held-out coalition F1
(also streamed over row blocks), TAPAScore, Delta-stay, FMS, CKNNA, L0, dead fraction and the streaming FVU
accumulator.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import sparse

from pipeline.metrics.cknna import cknna
from pipeline.metrics.fms import fms
from pipeline.metrics.matching import binarise, coalition_counts, coalition_f1, counts_f1, delta_match_score, fbmp, one_to_one
from pipeline.metrics.reconstruction import ReconstructionAccumulator, dead_fraction, l0
from pipeline.metrics.tapas import delta_stay, tapascore

FORMATS = [sparse.csr_array, sparse.csc_array, sparse.coo_array, sparse.csr_matrix]


def random_codes(rng: np.random.Generator, n: int, latents: int, density: float, grid: bool = True) -> np.ndarray:
    """Non-negative float32 codes with about `density` non-zeros; a few rows empty and latents never active.
    grid: values are multiples of 1/8 (every product and sum exact in float64)."""
    values = (rng.integers(1, 24, (n, latents)) / 8.0) if grid else rng.random((n, latents)) + 0.01
    codes = np.where(rng.random((n, latents)) < density, values, 0.0).astype(np.float32)
    codes[: max(1, n // 20)] = 0.0  # empty rows
    codes[:, -2:] = 0.0  # never-active latents
    return codes


def one_hot_labels(rng: np.random.Generator, n: int, families: int, values: int) -> np.ndarray:
    labels = np.zeros((n, families * values), dtype=bool)
    labels[np.arange(n)[:, None], np.arange(families) * values + rng.integers(0, values, (n, families))] = True
    return labels


def assert_same_matching(a, b) -> None:
    assert [c.tolist() for c in a.coalitions] == [c.tolist() for c in b.coalitions]
    np.testing.assert_array_equal(a.f1, b.f1)
    assert a.score == b.score or (np.isnan(a.score) and np.isnan(b.score))


# --- hand-checked -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_hand_case_matching_from_sparse_codes(fmt):
    """The dense tests' hand case (test_metrics_matching._hand_case) as sparse input: the same hand-computed
    coalitions, F1 and MATCHScores."""
    rows = [[1, 1, 0, 0, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0, 1, 0], [0, 0, 0, 0, 1, 1, 1, 1],
            [1, 1, 1, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 1, 0, 0, 0, 1, 0]]
    active = fmt(np.array(rows, dtype=bool).T)
    labels = np.array([[1, 1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 1, 1], [0] * 8], dtype=bool).T
    result = fbmp(active, labels, beta=0.5, k=3)
    assert [c.tolist() for c in result.coalitions] == [[0, 1], [2], []]
    np.testing.assert_allclose(result.f1, [0.75, 2 / 3, np.nan], rtol=0, atol=1e-15)
    o2o = one_to_one(active, labels)
    assert [c.tolist() for c in o2o.coalitions] == [[0], [2], []]
    assert delta_match_score(result, o2o) == pytest.approx(17 / 24 - 2 / 3, abs=1e-15)


def test_hand_case_binarise_sparse_keeps_only_active_entries():
    codes = np.array([[0.0, 5e-9, 2e-8], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    active = binarise(sparse.csr_array(codes))
    assert sparse.issparse(active) and active.dtype == np.bool_
    np.testing.assert_array_equal(active.toarray(), [[False, False, True], [True, False, False], [False, False, False]])
    assert active.nnz == 2  # the 5e-9 entry is stored in the input but not active
    np.testing.assert_array_equal(binarise(sparse.csr_array(codes), threshold=0.0).toarray(), binarise(codes, threshold=0.0))
    with pytest.raises(ValueError, match="threshold: expected >= 0"):
        binarise(sparse.csr_array(codes), threshold=-1.0)
    codes[1, 2] = np.inf
    with pytest.raises(ValueError, match="non-finite value inf at row 1, latent 2"):
        binarise(sparse.csr_array(codes))
    assert binarise(sparse.csr_array((0, 3), dtype=np.float32)).shape == (0, 3)


def test_hand_case_tapas_and_delta_stay_from_sparse_codes():
    """The dense tests' TAPAScore hand case (test_metrics_tapas) as CSR: published, TAPAScore 7/6 (delta_add 2/3 over
    the pairs that add, delta_rem -1/2); counting every pair ("zero"), TAPAScore 1, delta_add 1/2."""
    coalitions = [np.array([0, 1]), np.array([2, 3]), np.array([3, 4])]

    def codes(on):
        dense = np.zeros((len(on), 6), dtype=bool)
        for row, latents in enumerate(on):
            dense[row, latents] = True
        return sparse.csr_array(dense)

    before, after = codes([[0], [2, 3], [1], []]), codes([[2], [3, 4], [1], []])
    added, removed = np.array([1, 2, -1, 0]), np.array([0, 1, 0, 2])
    result = tapascore(before, after, added, removed, coalitions)
    assert (result.score, result.delta_add, result.delta_rem) == pytest.approx((7 / 6, 2 / 3, -0.5), abs=1e-15)
    zero = tapascore(before, after, added, removed, coalitions, empty="zero")
    assert (zero.score, zero.delta_add, zero.delta_rem) == (1.0, 0.5, -0.5)
    assert (result.n_pairs, result.n_add, result.n_rem) == (4, 3, 4)
    # Delta-stay: pair 1 has attribute 0 present besides its edit (1 -> 2); its coalition {0, 1} is off on both sides.
    present = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 0], [0, 0, 1]], dtype=bool)
    assert delta_stay(before, after, present, added, removed, coalitions) == 0.0


# --- random cases: sparse == dense ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_random_matching_sparse_equals_dense(seed):
    rng = np.random.default_rng(seed)
    n, latents = int(rng.integers(30, 200)), int(rng.integers(5, 60))
    codes = random_codes(rng, n, latents, density=float(rng.uniform(0.02, 0.5)))
    labels = rng.random((n, int(rng.integers(1, 8)))) < 0.3
    labels[:, -1] = False if seed % 2 else labels[:, -1]  # sometimes an attribute without positives
    fmt = FORMATS[seed % len(FORMATS)]
    dense, sparse_active = binarise(codes), binarise(fmt(codes))
    np.testing.assert_array_equal(sparse_active.toarray(), dense)
    for beta, k in [(0.5, 3), (1.0, 1), (0.25, min(5, latents))]:
        assert_same_matching(fbmp(sparse_active, labels, beta, k), fbmp(dense, labels, beta, k))
    assert_same_matching(one_to_one(sparse_active, labels), one_to_one(dense, labels))
    coalitions = fbmp(dense, labels, 0.5, 3).coalitions
    np.testing.assert_array_equal(coalition_f1(sparse_active, labels, coalitions), coalition_f1(dense, labels, coalitions))
    # held-out F1 streamed over row blocks equals one pass
    blocks = np.array_split(np.arange(n), 4)
    streamed = sum(coalition_counts(sparse_active[b], labels[b], coalitions) for b in blocks)
    np.testing.assert_array_equal(counts_f1(streamed), coalition_f1(dense, labels, coalitions))


@pytest.mark.parametrize("seed", range(5))
def test_random_tapas_and_delta_stay_sparse_equal_dense(seed):
    rng = np.random.default_rng(100 + seed)
    pairs, latents, attributes = int(rng.integers(5, 80)), int(rng.integers(6, 40)), int(rng.integers(2, 9))
    before = rng.random((pairs, latents)) < 0.2
    after = rng.random((pairs, latents)) < 0.2
    coalitions = [rng.choice(latents, size=int(rng.integers(0, 4)), replace=False) for _ in range(attributes)]
    added = rng.integers(-1, attributes, pairs)
    removed = rng.integers(0, attributes, pairs)
    present = rng.random((pairs, attributes)) < 0.5
    fmt = FORMATS[seed % len(FORMATS)]
    for empty in ("drop_pair", "zero", "skip"):
        ours, dense = tapascore(fmt(before), fmt(after), added, removed, coalitions, empty), tapascore(before, after, added, removed, coalitions, empty)
        assert ours == dense or all(a == b or (np.isnan(a) and np.isnan(b)) for a, b in zip(vars(ours).values(), vars(dense).values()))
        sparse_stay = delta_stay(fmt(before), fmt(after), present, added, removed, coalitions, empty)
        dense_stay = delta_stay(before, after, present, added, removed, coalitions, empty)
        assert sparse_stay == dense_stay or (np.isnan(sparse_stay) and np.isnan(dense_stay))


@pytest.mark.parametrize("seed", range(3))
def test_random_fms_sparse_equals_dense(seed):
    rng = np.random.default_rng(200 + seed)
    n, latents = 160, 30
    codes = random_codes(rng, n, latents, density=[0.05, 0.2, 0.6][seed], grid=False)
    labels = one_hot_labels(rng, n, 2, 3)
    labels[:, 0] |= codes[:, 3] > 0.5  # one concept a latent explains
    dense, csr = fms(codes, labels, max_n=100, seed=seed), fms(sparse.csr_array(codes), labels, max_n=100, seed=seed)
    for field in ("per_concept", "root_accuracy", "local", "global_", "root_feature", "depth", "cut_accuracy", "n_rows"):
        np.testing.assert_array_equal(getattr(csr, field), getattr(dense, field), err_msg=field)
    assert csr.fms == dense.fms


@pytest.mark.parametrize("seed", range(4))
def test_random_cknna_sparse_equals_dense(seed):
    rng = np.random.default_rng(300 + seed)
    n = int(rng.integers(12, 60))
    codes = random_codes(rng, n, int(rng.integers(8, 40)), density=0.3)
    codes[:, 0] += 1.0  # no all-zero row (a zero kernel row ties every neighbour)
    x = rng.integers(-8, 8, (n, 6)) / 4.0
    max_n = None if seed % 2 else n - 3  # with and without subsampling
    exact = cknna(codes, x, k=3, max_n=max_n, seed=seed)
    assert cknna(sparse.csr_array(codes), x, k=3, max_n=max_n, seed=seed) == exact  # grid values: exact products
    assert cknna(sparse.csr_array(codes), sparse.csr_array(x), k=3, max_n=max_n, seed=seed) == exact
    smooth = random_codes(rng, n, 20, density=0.4, grid=False) + 0.01
    assert cknna(sparse.csr_array(smooth), x, k=3) == pytest.approx(cknna(smooth, x, k=3), abs=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_random_reconstruction_stats_sparse_equal_dense(seed):
    rng = np.random.default_rng(400 + seed)
    codes = random_codes(rng, 90, 25, density=0.2)
    assert l0(sparse.csr_array(codes)) == l0(codes)
    assert dead_fraction(sparse.coo_array(codes)) == dead_fraction(codes)
    x = rng.normal(size=(90, 4)) + 3.0
    x_hat = x + rng.normal(scale=0.1, size=x.shape)
    dense, csr = ReconstructionAccumulator(4, 25), ReconstructionAccumulator(4, 25)
    for rows in np.array_split(np.arange(90), 3):
        dense.update(x[rows], x_hat[rows], codes[rows])
        csr.update(x[rows], x_hat[rows], sparse.csr_array(codes[rows]))
    assert csr.result() == dense.result()


def test_sparse_inputs_are_checked_like_dense_ones():
    active = sparse.csr_array(np.eye(4, 3, dtype=bool))
    labels = np.eye(4, 2, dtype=bool)
    with pytest.raises(TypeError, match="active: expected bool"):
        fbmp(sparse.csr_array(np.eye(4, 3)), labels)
    with pytest.raises(ValueError, match="labels: expected 4 rows"):
        one_to_one(active, labels[:3])
    with pytest.raises(TypeError, match="before: expected a bool"):
        tapascore(sparse.csr_array(np.eye(4, 3)), active, np.zeros(4, np.int64), np.zeros(4, np.int64), [np.array([0]), np.array([1])])
    with pytest.raises(ValueError, match="codes: contains NaN"):
        fms(sparse.csr_array(np.array([[np.nan, 1.0], [0.0, 1.0]])), np.array([True, False]))
    with pytest.raises(ValueError, match="a: contains NaN"):
        cknna(sparse.csr_array(np.full((5, 2), np.nan)), np.ones((5, 2)))
    with pytest.raises(TypeError, match="active: expected a bool numpy array or scipy.sparse matrix, got list"):
        fbmp([[True]], labels)
