"""Tests for pipeline.metrics.matching: one-to-one matching, FBMP coalitions, MATCHScore."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import sparse
from sklearn.metrics import f1_score, fbeta_score

from pipeline.metrics import matching
from pipeline.metrics.matching import Matching, delta_match_score, fbmp, one_to_one


def _hand_case() -> tuple[np.ndarray, np.ndarray]:
    """8 images, 6 latents, 3 attributes (see the expected numbers in the tests)."""
    rows = [
        [1, 1, 0, 0, 0, 0, 0, 0],  # l0
        [0, 0, 1, 0, 0, 0, 1, 0],  # l1
        [0, 0, 0, 0, 1, 1, 1, 1],  # l2
        [1, 1, 1, 0, 1, 1, 0, 0],  # l3
        [0, 0, 0, 1, 1, 1, 1, 1],  # l4
        [0, 0, 1, 0, 0, 0, 1, 0],  # l5 = l1 (a tie that l1 must win)
    ]
    active = np.array(rows, dtype=bool).T
    labels = np.array(
        [
            [1, 1, 1, 1, 0, 0, 0, 0],  # attribute 0
            [0, 0, 0, 0, 0, 0, 1, 1],  # attribute 1
            [0, 0, 0, 0, 0, 0, 0, 0],  # attribute 2: no positives
        ],
        dtype=bool,
    ).T
    return active, labels


def test_one_to_one_hand_computed_with_tie() -> None:
    active, labels = _hand_case()
    result = one_to_one(active, labels)
    # Attribute 0: F1 of l0 = 2*2/(4+2) = 2/3 ties l3 = 2*3/(4+5) = 2/3 -> lower index l0.
    # Attribute 1: l2 = 2*2/(2+4) = 2/3 beats l4 = 4/7 and l1 = l5 = 1/2. Attribute 2 has no positives: no match,
    # F1 NaN, left out of MATCHScore = mean(2/3, 2/3).
    assert [c.tolist() for c in result.coalitions] == [[0], [2], []]
    np.testing.assert_allclose(result.f1, [2 / 3, 2 / 3, np.nan], rtol=0, atol=1e-15)
    assert result.score == pytest.approx(2 / 3, abs=1e-15)


def test_fbmp_hand_computed_with_early_stop_tie_and_empty_attribute() -> None:
    active, labels = _hand_case()
    result = fbmp(active, labels, beta=0.5, k=3)
    # Attribute 0, scores TP / (0.25 |r| + |l|):
    #   step 0 (|r| = 4): l0 2/3, l3 1/2, l1 = l5 1/3, l4 1/6 -> l0; F1 = 4/6; residual = images {2, 3}.
    #   step 1 (|r| = 2): l1 = l5 1/2.5 (tie -> l1), l4 1/5.5, l3 1/5.5 -> l1; F1 = 6/8 > 4/6, kept; residual = {3}.
    #   step 2 (|r| = 1): only l4 covers image 3 -> l4; but F1 = 8/12 < 6/8: stop, l4 not added.
    # Attribute 1: step 0 l2 (2/4.5) -> F1 = 2/3, empty residual; step 1 all 0 -> l0, F1 4/8 < 2/3: stop.
    # Attribute 2: no positives: nothing to match, F1 NaN, left out of MATCHScore = mean(3/4, 2/3) = 17/24.
    assert [c.tolist() for c in result.coalitions] == [[0, 1], [2], []]
    np.testing.assert_allclose(result.f1, [0.75, 2 / 3, np.nan], rtol=0, atol=1e-15)
    assert result.score == pytest.approx(17 / 24, abs=1e-15)
    assert fbmp(active, labels, beta=0.5, k=1).coalitions[0].tolist() == [0]
    assert delta_match_score(result, one_to_one(active, labels)) == pytest.approx(17 / 24 - 2 / 3, abs=1e-15)
    # the coalitions' prefixes: attribute 0 is 4/6 after l0, 3/4 after l1 (and stays: l4 was rejected); attribute 1 is
    # 2/3 from its first latent on
    np.testing.assert_allclose(result.prefix_f1, [[4 / 6, 2 / 3, np.nan], [0.75, 2 / 3, np.nan], [0.75, 2 / 3, np.nan]], rtol=0, atol=1e-15)
    first = result.truncated(1)
    assert [c.tolist() for c in first.coalitions] == [[0], [2], []] and first.score == pytest.approx((4 / 6 + 2 / 3) / 2, abs=1e-15)
    with pytest.raises(ValueError, match="k: expected 1 <= k <= 3"):
        result.truncated(4)
    with pytest.raises(ValueError, match="k: expected 1 <= k <= 3"):
        result.truncated(0)


def _reference_fbmp(active: np.ndarray, labels: np.ndarray, beta: float, k: int) -> list[list[int]]:
    """Straight per-attribute, per-latent loop over scikit-learn scorers (the FBMP pseudo-code of docs/science.md §3)."""
    coalitions = []
    for a in range(labels.shape[1]):
        y = labels[:, a]
        if not y.any():  # no positives: nothing to match
            coalitions.append([])
            continue
        residual = y.copy()
        yhat = np.zeros_like(y)
        chosen: list[int] = []
        for step in range(k):
            scores = [
                fbeta_score(residual, active[:, latent], beta=beta, zero_division=0.0)
                for latent in range(active.shape[1])
            ]
            # Round away float noise so that equal rationals tie, then lowest index wins.
            best = int(np.argmax(np.round(scores, 12)))
            residual = residual & ~active[:, best]
            new_hat = yhat | active[:, best]
            if step > 0 and f1_score(y, new_hat, zero_division=0.0) <= f1_score(y, yhat, zero_division=0.0):
                break
            yhat = new_hat
            chosen.append(best)
        coalitions.append(chosen)
    return coalitions


@pytest.mark.parametrize("beta", [0.25, 0.5, 1.0])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_fbmp_equals_brute_force_reference(beta: float, k: int) -> None:
    rng = np.random.default_rng(int(beta * 100) + k)
    n, n_latents = 60, 12
    base = rng.random((n, 3)) < 0.3
    active = rng.random((n, n_latents)) < rng.uniform(0.05, 0.4, size=n_latents)
    active[:, 5] = False  # a latent that never fires
    active[:, 7:10] |= base  # latents aligned with the planted attributes
    labels = np.concatenate([base, rng.random((n, 2)) < 0.2, np.zeros((n, 1), dtype=bool)], axis=1)
    result = fbmp(active, labels, beta=beta, k=k)
    assert [c.tolist() for c in result.coalitions] == _reference_fbmp(active, labels, beta, k)
    for a, coalition in enumerate(result.coalitions):
        if not labels[:, a].any():
            assert np.isnan(result.f1[a]) and coalition.size == 0
            continue
        pred = active[:, coalition].any(axis=1)
        assert result.f1[a] == pytest.approx(f1_score(labels[:, a], pred, zero_division=0.0), abs=1e-12)
        for j in range(k):  # the prefixes' F1, each against scikit-learn's
            pred = active[:, coalition[: j + 1]].any(axis=1)
            assert result.prefix_f1[j, a] == pytest.approx(f1_score(labels[:, a], pred, zero_division=0.0), abs=1e-12)
    for smaller in range(1, k + 1):  # greedy: FBMP with a smaller k is the prefix, scores included
        prefix, direct = result.truncated(smaller), fbmp(active, labels, beta=beta, k=smaller)
        assert [c.tolist() for c in prefix.coalitions] == [c.tolist() for c in direct.coalitions]
        np.testing.assert_array_equal(prefix.f1, direct.f1)
        np.testing.assert_array_equal(prefix.prefix_f1, direct.prefix_f1)
        assert prefix.score == direct.score


def test_fbmp_at_least_one_to_one_on_random_data() -> None:
    rng = np.random.default_rng(5)
    for trial in range(5):
        active = rng.random((200, 40)) < 0.1
        labels = rng.random((200, 8)) < 0.15
        assert fbmp(active, labels, beta=0.5, k=3).score >= one_to_one(active, labels).score - 1e-12
        # With beta = 1 and one latent, FBMP is one-to-one.
        first = fbmp(active, labels, beta=1.0, k=1)
        o2o = one_to_one(active, labels)
        assert [c.tolist() for c in first.coalitions] == [c.tolist() for c in o2o.coalitions]
        np.testing.assert_array_equal(first.f1, o2o.f1)
        np.testing.assert_array_equal(first.prefix_f1, o2o.prefix_f1)


def test_sparse_counts_equal_the_dense_product() -> None:
    rng = np.random.default_rng(6)
    active = rng.random((101, 9)) < 0.3
    labels = rng.random((101, 4)) < 0.3
    expected = active.astype(np.int64).T @ labels.astype(np.int64)
    np.testing.assert_array_equal(matching._tp_counts(matching._check_active(active), labels), expected)
    np.testing.assert_array_equal(matching._tp_counts(matching._check_active(sparse.csc_matrix(active)), labels), expected)


def test_matching_result_types() -> None:
    active, labels = _hand_case()
    result = fbmp(active, labels)
    assert isinstance(result, Matching)
    assert all(c.dtype == np.int64 for c in result.coalitions)
    assert result.f1.dtype == np.float64 and result.f1.shape == (3,)


def test_bad_inputs_raise_clear_errors() -> None:
    active, labels = _hand_case()
    with pytest.raises(TypeError, match="bool"):
        fbmp(active.astype(np.float32), labels)
    with pytest.raises(TypeError, match="bool"):
        one_to_one(active, labels.astype(int))
    with pytest.raises(ValueError, match="rows"):
        fbmp(active[:5], labels)
    with pytest.raises(ValueError, match="k:"):
        fbmp(active, labels, k=7)
    with pytest.raises(ValueError, match="k:"):
        fbmp(active, labels, k=0)
    with pytest.raises(ValueError, match="beta"):
        fbmp(active, labels, beta=0.0)
    with pytest.raises(ValueError, match="2-D"):
        one_to_one(active[:, 0], labels)
    short = one_to_one(active, labels[:, :2])
    with pytest.raises(ValueError, match="attributes"):
        delta_match_score(short, one_to_one(active, labels))


def test_coalition_f1_scores_given_coalitions_on_new_rows():
    from pipeline.metrics.matching import coalition_f1

    active = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]], dtype=bool)
    labels = np.array([[1, 0], [1, 0], [0, 1], [0, 1]], dtype=bool)
    # attribute 0 <- latents {0, 1}: predicted rows 0, 1, 3; true rows 0, 1 -> F1 = 2*2/(2+3) = 0.8
    # attribute 1 <- latent {2}: predicted row 2; true rows 2, 3 -> F1 = 2*1/(2+1) = 2/3
    f1 = coalition_f1(active, labels, [np.array([0, 1]), np.array([2])])
    np.testing.assert_allclose(f1, [0.8, 2 / 3])
    fitted = fbmp(active, labels, beta=0.5, k=3)
    np.testing.assert_allclose(coalition_f1(active, labels, fitted.coalitions), fitted.f1)



def test_member_counts_count_several_rules_in_one_product():
    """Two rules on the hand-computed case above: the counts of each equal its own `coalition_counts` and the hand
    counts; a latent listed twice in a coalition and an empty coalition count as a set would."""
    from pipeline.metrics.matching import coalition_counts, coalition_members, member_counts

    active = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]], dtype=bool)
    labels = np.array([[1, 0], [1, 0], [0, 1], [0, 1]], dtype=bool)
    rules = [[np.array([0, 1]), np.array([2])], [np.array([1, 1]), np.array([], dtype=np.int64)]]
    counts = member_counts(sparse.csr_array(active), labels, coalition_members(rules, 3, 2))
    # rule 0: attribute 0 fires on rows 0, 1, 3 (TP 2), attribute 1 on row 2 (TP 1); rule 1: attribute 0 on rows 1, 3
    # (TP 1), attribute 1 never
    np.testing.assert_array_equal(counts, [[[2, 1], [3, 1], [2, 2]], [[1, 0], [2, 0], [2, 2]]])
    for rule, got in zip(rules, counts):
        np.testing.assert_array_equal(got, coalition_counts(active, labels, rule))
    with pytest.raises(ValueError, match="members: expected coalition_members"):
        member_counts(active, labels, coalition_members(rules, 4, 2))


def test_coalition_indices_are_checked_not_wrapped_or_truncated():
    from pipeline.metrics.matching import coalition_f1

    active = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]], dtype=bool)
    labels = np.array([[1, 0], [1, 0], [0, 1], [0, 1]], dtype=bool)
    with pytest.raises(ValueError, match=r"coalitions\[0\]: latent indices must be in \[0, 3\), got -1"):
        coalition_f1(active, labels, [np.array([-1]), np.array([2])])
    # the bounds are checked over every coalition at once; the message still names the culprit
    with pytest.raises(ValueError, match=r"coalitions\[1\]: latent indices must be in \[0, 3\), got 1..3"):
        coalition_f1(active, labels, [np.array([0, 2]), np.array([1, 3])])
    with pytest.raises(ValueError, match=r"coalitions\[1\]: latent indices must be in \[0, 3\), got 0..18446744073709551615"):
        coalition_f1(active, labels, [np.array([0]), np.array([0, 2**64 - 1], dtype=np.uint64)])
    with pytest.raises(TypeError, match=r"coalitions\[1\]: expected a 1-D array of integer latent indices, got float64"):
        coalition_f1(active, labels, [np.array([0]), np.array([3.7])])
    with pytest.raises(ValueError, match="one per attribute"):
        coalition_f1(active, labels, [np.array([0])])


def test_binarise_uses_the_published_threshold_and_refuses_nan():
    from pipeline.metrics.conventions import PUBLISHED_THRESHOLD
    from pipeline.metrics.matching import binarise

    codes = np.array([[0.0, 5e-9, 2e-8], [1.0, 0.0, 0.0]])
    assert PUBLISHED_THRESHOLD == 1e-8
    np.testing.assert_array_equal(binarise(codes), [[False, False, True], [True, False, False]])
    np.testing.assert_array_equal(binarise(codes, threshold=0.0), [[False, True, True], [True, False, False]])
    codes[1, 2] = np.nan
    with pytest.raises(ValueError, match="non-finite value nan at row 1, latent 2"):
        binarise(codes)


def test_shared_first_step_counts_give_the_same_matchings() -> None:
    from pipeline.metrics.matching import tp_counts

    rng = np.random.default_rng(11)
    active = rng.random((200, 30)) < 0.15
    labels = rng.random((200, 5)) < 0.3
    labels[:, 4] = False  # an undefined attribute
    tp = tp_counts(active, labels)
    for beta, k in [(0.5, 3), (1.0, 5), (0.25, 2)]:
        a, b = fbmp(active, labels, beta, k, tp=tp), fbmp(active, labels, beta, k)
        assert [c.tolist() for c in a.coalitions] == [c.tolist() for c in b.coalitions]
        np.testing.assert_array_equal(a.f1, b.f1)
    np.testing.assert_array_equal(one_to_one(active, labels, tp=tp).f1, one_to_one(active, labels).f1)
    with pytest.raises(ValueError, match="tp: expected counts of shape"):
        fbmp(active, labels, tp=tp[:, :2])


def test_the_dense_and_sparse_products_count_the_same(monkeypatch) -> None:
    """_tp_counts takes a sparse x dense product in float32 blocks for dense targets and a sparse x sparse one in
    int64 for sparse targets: both exact, so FBMP and one-to-one do not depend on which ran (blocks of 7 rows
    here, so the block sums are exercised)."""
    rng = np.random.default_rng(5)
    active = rng.random((100, 30)) < 0.2
    labels = rng.random((100, 6)) < 0.3
    monkeypatch.setattr(matching, "_BLOCK_ROWS", 7)
    results = {}
    for name, threshold in (("dense", 0.0), ("sparse", 1.1)):
        monkeypatch.setattr(matching, "DENSE_TARGETS", threshold)
        counts = matching.tp_counts(active, labels)
        np.testing.assert_array_equal(counts, active.T.astype(np.int64) @ labels.astype(np.int64))
        assert counts.dtype == np.int64
        results[name] = (fbmp(active, labels, beta=0.5, k=4), one_to_one(active, labels))
    for dense, sparse_ in zip(results["dense"], results["sparse"]):
        assert [c.tolist() for c in dense.coalitions] == [c.tolist() for c in sparse_.coalitions]
        np.testing.assert_array_equal(dense.f1, sparse_.f1)


@pytest.mark.parametrize("aligned", [True, False])
def test_later_steps_count_the_newly_covered_labels_or_the_residual_alike(aligned: bool) -> None:
    """After a step FBMP's TP counts against the residual are the previous ones less the TP of the labels the
    chosen latent newly covers, or the residual's own, whichever has fewer rows. Strongly aligned latents (most
    labels covered at the first step) take the second way, weak ones the first; dense and sparse codes, up to five
    steps with rejections and attributes leaving at different steps: the reference coalitions and their F1."""
    rng = np.random.default_rng(11)
    n, n_latents = 400, 16
    labels = rng.random((n, 5)) < np.array([0.03, 0.1, 0.2, 0.3, 0.5])
    active = rng.random((n, n_latents)) < 0.2
    if aligned:
        active[:, :4] = labels[:, :4] & (rng.random((n, 4)) < 0.9)
        active[:, 4:8] = labels[:, :4] & (rng.random((n, 4)) < 0.5)  # a second latent per attribute: new rows and old ones
    expected = _reference_fbmp(active, labels, 0.5, 5)
    assert len({len(c) for c in expected}) > 1, "attributes leave at different steps"
    newly = sum(int((labels[:, a] & active[:, c[0]]).sum()) for a, c in enumerate(expected))
    assert (newly > labels.sum() - newly) == aligned
    for codes in (active, sparse.csr_array(active)):
        result = fbmp(codes, labels, beta=0.5, k=5)
        assert [c.tolist() for c in result.coalitions] == expected
        for a, coalition in enumerate(expected):
            predicted = active[:, coalition].any(axis=1)
            assert result.f1[a] == pytest.approx(f1_score(labels[:, a], predicted))


def test_strongest_keeps_each_rows_largest_activations_by_hand() -> None:
    codes = np.array([[0.0, 3.0, 1.0, 2.0],   # keeps 3 and 2
                      [5.0, 0.0, 0.0, 0.0],   # one activation: kept whole
                      [1.0, 1.0, 1.0, 0.0],   # a tie: the lower latents win
                      [0.0, 0.0, 0.0, 0.0]])  # nothing active
    expected = np.array([[0, 3, 0, 2], [5, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=float)
    np.testing.assert_array_equal(matching.strongest(codes, 2).toarray(), expected)
    np.testing.assert_array_equal(matching.strongest(sparse.csr_matrix(codes), 2).toarray(), expected)
    np.testing.assert_array_equal(matching.strongest(codes, 4).toarray(), codes)
    with pytest.raises(ValueError, match="k: expected >= 1"):
        matching.strongest(codes, 0)


def test_strongest_keeps_at_most_k_per_row_and_never_a_smaller_one_over_a_larger_one() -> None:
    rng = np.random.default_rng(0)
    codes = sparse.random_array((300, 40), density=0.3, random_state=rng, format="csr")
    kept = matching.strongest(codes, 3)
    dense, kept_dense = codes.toarray(), kept.toarray()
    assert (np.diff(kept.indptr) == np.minimum(np.diff(codes.tocsr().indptr), 3)).all()
    assert ((kept_dense == 0) | (kept_dense == dense)).all(), "kept values are the codes' own"
    dropped = np.where(kept_dense == 0, dense, 0)
    smallest_kept = np.where(kept_dense > 0, kept_dense, np.inf).min(1)
    assert (dropped.max(1) <= smallest_kept).all()


def test_weak_activations_off_the_concept_cost_matchscore_and_the_strongest_codes_show_it() -> None:
    """The k = 32 case in small: a latent fires strongly exactly on its attribute and weakly on half the other rows.
    Binarised, the weak activations count like strong ones and halve its precision; each row's strongest
    activation matches the attribute exactly."""
    labels = np.zeros((8, 2), dtype=bool)
    labels[:4, 0] = labels[4:, 1] = True
    codes = np.zeros((8, 2))
    codes[:4, 0] = codes[4:, 1] = 1.0  # the concept latents, strong
    codes[4:6, 0] = codes[:2, 1] = 0.01  # and weak where their attribute is absent
    full = fbmp(matching.binarise(codes), labels, k=1)
    assert full.f1 == pytest.approx([2 * 4 / (4 + 6)] * 2)  # precision 4/6, recall 1
    assert fbmp(matching.binarise(matching.strongest(codes, 1)), labels, k=1).score == 1.0
