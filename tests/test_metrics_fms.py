"""Tests for pipeline.metrics.fms: the Feature Monosemanticity Score (Härle et al. 2025), grown with torch.

References (tests/fms_reference.py): scikit-learn's trees, where no tie between latents decides a tree, and a plain
numpy greedy tree with our tie rule where ties do.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
import torch

from pipeline.metrics.fms import FMSResult, fms, fms_of_sets
from tests.fms_reference import sklearn_fms, stump_chain, tree_levels

EVERY_ROW = {"max_n": 10**6, "balanced": False}  # no subsampling: the references see the same rows


def test_perfectly_monosemantic_latent_scores_one_by_the_papers_formula() -> None:
    # Latent 0 is the concept; latent 1 is always off. Root split is perfect (accs_0 = 1), no deeper
    # level (global = 1); without latent 0 nothing can split: majority 4/8 = 0.5 -> local = 2 (1 - 0.5) = 1.
    y = np.array([1, 1, 1, 1, 0, 0, 0, 0], dtype=bool)
    codes = np.stack([y.astype(float), np.zeros(8)], axis=1)
    result = fms(codes, y, removals=1, levels="paper", exhausted="majority")
    assert isinstance(result, FMSResult)
    assert result.fms == 1.0
    assert result.root_accuracy.tolist() == [1.0]
    assert result.local.tolist() == [1.0]
    assert result.global_.tolist() == [1.0]
    assert result.root_feature.tolist() == [0]
    assert result.depth.tolist() == [1]


def test_published_exhausted_chain_drops_the_counts_no_latent_can_split(caplog: pytest.LogCaptureFixture) -> None:
    # The same concept: after removing latent 0 no latent can split, so every removal count is left out of the
    # published mean and the concept has no local term: NaN, with a warning saying why.
    y = np.array([1, 1, 1, 1, 0, 0, 0, 0], dtype=bool)
    codes = np.stack([y.astype(float), np.zeros(8)], axis=1)
    with caplog.at_level("WARNING", logger="pipeline.metrics.fms"):
        result = fms(codes, y)
    assert (result.removals, result.levels, result.exhausted) == (tuple(range(1, 10)), "published", "drop")
    assert np.isnan(result.per_concept[0]) and np.isnan(result.fms) and np.isnan(result.cut_accuracy[0, 1:]).all()
    assert "no latent is left to split" in caplog.text


def test_published_convention_hand_computed() -> None:
    # y = a OR b: latent a covers 3 positives, latent b the 4th; 4 negatives (the next test's case). accs_0 = 7/8.
    # Published global term: levels {no split 0.5, depth 2 1.0} -> 1 - mean(0.5 - 7/8, 1 - 7/8) = 9/8 (above 1).
    # Published local term over removals 1..9: after one removal (a) the stump on b gets 5/8; after two nothing can
    # split, so counts 2..9 leave the mean: local = 2 (7/8 - 5/8) = 1/2. FMS = 7/8 (1/2 + 9/8) / 2 = 91/128.
    a = np.array([1, 1, 1, 0, 0, 0, 0, 0], dtype=float)
    b = np.array([0, 0, 0, 1, 0, 0, 0, 0], dtype=float)
    y = (a + b) > 0
    codes = np.stack([b, a, np.zeros(8)], axis=1)
    published = fms(codes, y)
    assert published.global_[0] == pytest.approx(9 / 8, abs=1e-15)
    assert published.local[0] == pytest.approx(0.5, abs=1e-15)
    assert published.fms == pytest.approx(91 / 128, abs=1e-15)
    assert published.cut_accuracy[0, :2].tolist() == [7 / 8, 5 / 8] and np.isnan(published.cut_accuracy[0, 2:]).all()
    # Our earlier convention: the exhausted counts score the majority rate 1/2: local = (1/2 + 8 * 3/4) / 9 = 13/18.
    majority = fms(codes, y, exhausted="majority")
    assert majority.local[0] == pytest.approx(13 / 18, abs=1e-15)
    assert majority.fms == pytest.approx(7 / 8 * (13 / 18 + 9 / 8) / 2, abs=1e-15)  # 0.80815972...


def test_concept_split_over_two_latents_hand_computed() -> None:
    # y = a OR b: latent a covers 3 positives, latent b the 4th; 4 negatives. Gini picks a at the root
    # (weighted impurity 1/5 vs 3/7). accs_0 = (3 + 4)/8 = 7/8; depth 2 reaches 1.0, so
    # global = 1 - (1 - 7/8)/1 = 7/8. Without a the stump on b gets (1 + 4)/8 = 5/8: local@1 = 2 (7/8 - 5/8) = 1/2;
    # without b too nothing splits: 4/8, local@2 = 2 (7/8 - 1/2) = 3/4 (majority), or undefined (published).
    a = np.array([1, 1, 1, 0, 0, 0, 0, 0], dtype=float)
    b = np.array([0, 0, 0, 1, 0, 0, 0, 0], dtype=float)
    y = (a + b) > 0
    codes = np.stack([b, a, np.zeros(8)], axis=1)
    one = fms(codes, y, removals=1, levels="paper")
    assert one.root_feature.tolist() == [1]
    assert one.root_accuracy[0] == 7 / 8
    assert one.global_[0] == 7 / 8
    assert one.local[0] == 0.5
    assert one.fms == pytest.approx(7 / 8 * (0.5 + 7 / 8) / 2, abs=1e-15)  # 0.6015625
    two = fms(codes, y, removals=2, levels="paper", exhausted="majority")
    assert two.cut_accuracy[0].tolist() == [7 / 8, 5 / 8, 0.5]
    assert two.fms == pytest.approx(7 / 8 * (0.75 + 7 / 8) / 2, abs=1e-15)  # 0.7109375
    assert np.isnan(fms(codes, y, removals=2, levels="paper").fms)


def test_constant_concept_is_nan_and_excluded_from_the_mean() -> None:
    y = np.array([1, 1, 1, 1, 0, 0, 0, 0], dtype=bool)
    codes = np.stack([y.astype(float), np.zeros(8)], axis=1)
    labels = np.stack([y, np.zeros(8, dtype=bool)], axis=1)
    result = fms(codes, labels, removals=1, levels="paper", exhausted="majority")
    assert np.isnan(result.per_concept[1])
    assert result.root_feature.tolist() == [0, -1]
    assert result.fms == 1.0


def test_codes_that_cannot_split_a_concept_score_nan_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    y = np.array([1, 1, 1, 1, 0, 0, 0, 0], dtype=bool)
    with caplog.at_level("WARNING", logger="pipeline.metrics.fms"):
        result = fms(np.zeros((8, 3)), y)  # all-zero codes: once a plausible 0.25, now undefined
    assert np.isnan(result.fms) and np.isnan(result.per_concept[0])
    assert "concept 0: no latent separates" in caplog.text


def test_balancing_keeps_a_rare_perfect_concept_at_one() -> None:
    # 10 positives in 200 rows, latent 0 fires exactly on them. Balanced: 10 + 10 rows, FMS = 1.
    # Unbalanced: removing latent 0 leaves the majority rate 190/200, so local = 2 (1 - 0.95) = 0.1
    # and FMS = (0.1 + 1) / 2 = 0.55 although the latent is perfectly monosemantic.
    y = np.zeros(200, dtype=bool)
    y[::20] = True
    codes = np.stack([y.astype(float), np.zeros(200)], axis=1)
    balanced = fms(codes, y, removals=1, levels="paper", exhausted="majority")
    assert balanced.n_rows.tolist() == [20]
    assert balanced.fms == 1.0
    assert fms(codes, y, removals=1, levels="paper", balanced=False, exhausted="majority").fms == pytest.approx(0.55, abs=1e-12)


def _random_case(rng: np.random.Generator, n: int, latents: int, k: int, grid: bool) -> tuple[np.ndarray, np.ndarray]:
    """Sparse non-negative codes (k of `latents` non-zero per row; values on a grid of quarters: many ties, or
    uniform), some all-zero rows, and a label that mixes one latent with noise."""
    idx = np.stack([rng.choice(latents, k, replace=False) for _ in range(n)])
    values = rng.integers(1, 5, (n, k)) / 4.0 if grid else rng.random((n, k)) + 0.01
    codes = np.zeros((n, latents), np.float32)
    codes[np.arange(n)[:, None], idx] = values
    codes[: n // 10] = 0.0
    y = ((codes[:, 0] > 0) & (rng.random(n) < 0.8)) | (rng.random(n) < 0.3)
    return codes, y


def test_trees_equal_scikit_learns_where_no_tie_decides_them() -> None:
    """Dense signed codes (a random normal per entry) and sparse ones: wherever scikit-learn's result does not depend
    on its random visiting order of the latents (the same for eight random states), ours equals it exactly."""
    rng = np.random.default_rng(0)
    checked = 0
    for trial in range(24):
        if trial % 2:
            codes, y = _random_case(rng, int(rng.integers(30, 90)), int(rng.integers(8, 40)), 3, grid=False)
        else:
            n, latents = int(rng.integers(20, 70)), int(rng.integers(2, 8))
            codes = rng.normal(size=(n, latents)).astype(np.float32)
            y = codes[:, 0] + rng.normal(size=n) > 0
        if y.all() or not y.any():
            continue
        for exhausted in ("drop", "majority"):
            references = [sklearn_fms(codes, y, (1, 2, 3), "published", exhausted, random_state=r) for r in range(8)]
            if any(r is None for r in references):
                continue
            a = references[0]
            if any(b["depth"] != a["depth"] or not np.array_equal(b["cuts"], a["cuts"], equal_nan=True) or b["global"] != a["global"]
                   for b in references[1:]):
                continue  # a tie between latents decided scikit-learn's tree
            ours = fms(codes, y, removals=(1, 2, 3), exhausted=exhausted, **EVERY_ROW)
            assert ours.depth[0] == a["depth"] and ours.root_feature[0] == a["root"]
            np.testing.assert_array_equal(ours.cut_accuracy[0], a["cuts"])
            assert ours.global_[0] == pytest.approx(a["global"], abs=1e-12)
            assert ours.per_concept[0] == pytest.approx(a["fms"], abs=1e-12) or (np.isnan(a["fms"]) and np.isnan(ours.per_concept[0]))
            checked += 1
    assert checked >= 10, "too few cases without ties to compare"


def assert_equals_greedy_reference(codes: np.ndarray, y: np.ndarray) -> None:
    """Our tree of one concept on every row (depth, root, level accuracies as the paper's global term) and its removal
    chain equal the plain-numpy greedy tree that breaks ties as documented (lowest latent, then lowest threshold)."""
    levels, root = tree_levels(codes, y)
    ours = fms(codes, y, removals=(1, 2, 3, 4), levels="paper", **EVERY_ROW)
    assert ours.depth[0] == levels.size and ours.root_feature[0] == root
    assert ours.root_accuracy[0] == levels[0]
    assert ours.global_[0] == pytest.approx(1.0 - np.mean(levels[1:] - levels[0]) if levels.size > 1 else 1.0, abs=1e-12)
    np.testing.assert_array_equal(ours.cut_accuracy[0], stump_chain(codes, y, 5))


@pytest.mark.parametrize("seed", range(6))
def test_trees_equal_the_tie_rule_reference_on_codes_full_of_ties(seed: int) -> None:
    """Grid-valued sparse codes, where many latents tie: the tree, its level accuracies and the removal chain equal
    an independent plain-numpy greedy tree that breaks ties as documented (lowest latent, then lowest threshold)."""
    rng = np.random.default_rng(10 + seed)
    codes, y = _random_case(rng, int(rng.integers(40, 120)), int(rng.integers(6, 60)), int(rng.integers(1, 5)), grid=True)
    assert_equals_greedy_reference(codes, y)


@pytest.mark.parametrize("seed", range(4))
def test_pruned_search_stays_exact_with_values_near_zero_and_negative(seed: int) -> None:
    """The dense nodes' search skips groups that cannot beat a split the node is known to have (the zero split of
    its most enriched groups) and starts from the removal chain's root splits. Positive values within scikit-learn's
    1e-7 of zero (whose zero split does not exist) and negative values (always searched) must not change the tree:
    it equals the plain greedy reference."""
    rng = np.random.default_rng(40 + seed)
    codes, y = _random_case(rng, int(rng.integers(60, 140)), int(rng.integers(6, 30)), int(rng.integers(2, 5)), grid=True)
    nonzero = np.flatnonzero(codes)
    codes.flat[rng.choice(nonzero, nonzero.size // 4, replace=False)] = 5e-8  # one value with 0 for scikit-learn
    if seed % 2:
        codes.flat[rng.choice(nonzero, nonzero.size // 5, replace=False)] *= -1.0
    assert_equals_greedy_reference(codes, y)


@pytest.mark.parametrize("seed", range(4))
def test_binary_codes_score_single_valued_latents_from_their_counts(seed: int) -> None:
    """Codes of one value per latent (random codes, binarised ones): a latent's only split is its zero split, which
    the search scores from the class counts instead of its entries; the trees and the chain equal the plain greedy
    reference, with latents that fire on every row (no zero split) and on no row among them."""
    rng = np.random.default_rng(70 + seed)
    n, latents = int(rng.integers(60, 160)), int(rng.integers(8, 40))
    codes = (rng.random((n, latents)) < rng.uniform(0.05, 0.5, latents)).astype(np.float32) * rng.choice([1.0, 2.0], latents)
    codes[:, 0] = 3.0  # every row: constant, cannot split
    codes[:, 1] = 0.0
    y = (codes[:, 2] > 0) ^ (rng.random(n) < 0.3)
    assert_equals_greedy_reference(codes, y)


def test_a_latent_at_1e8_is_no_split_for_the_removal_chain() -> None:
    """A latent whose only values are 5e-8 on every positive row looks like a perfect zero split by its counts, but
    for scikit-learn it is constant (values within 1e-7 are one): it must neither be ranked nor push out, through
    the pruning bound, the latents that really split. The chain equals the plain reference."""
    y = np.arange(60) < 30
    codes = np.zeros((60, 5), np.float32)
    codes[:30, 0] = 5e-8
    for latent, (hits, misses) in enumerate([(28, 2), (26, 3), (24, 4), (6, 4)], start=1):
        codes[:hits, latent] = 1.0 + latent / 10
        codes[30 : 30 + misses, latent] = 1.0 + latent / 10
    ours = fms(codes, y, removals=(1, 2, 3), levels="paper", **EVERY_ROW)
    np.testing.assert_array_equal(ours.cut_accuracy[0], stump_chain(codes, y, 4))
    assert ours.root_feature[0] == 1


def test_the_bound_that_prunes_the_split_search_holds() -> None:
    """The search skips a (node, latent) whose rows with a positive value, (a, b) per class, cannot beat a known
    split: it relies on g(a, b) <= max(g(a, 0), g(0, b)) and on g(r, 0), g(0, r) growing with r, where g is the
    sum over sides of squared class counts over the side's size (node of P positives, N negatives). Checked for
    every node and count up to 30."""
    def g(a, b, pos, neg):
        left_pos, left_neg = pos - a, neg - b
        return (left_pos**2 + left_neg**2) / (left_pos + left_neg) + (a * a + b * b) / (a + b)

    for pos, neg in itertools.product(range(1, 31), repeat=2):
        a, b = np.meshgrid(np.arange(pos + 1, dtype=float), np.arange(neg + 1, dtype=float), indexing="ij")
        valid = (a + b > 0) & (a + b < pos + neg)
        with np.errstate(divide="ignore", invalid="ignore"):
            both = g(a, b, pos, neg)
            bound = np.maximum(np.where(a > 0, g(a, 0 * b, pos, neg), -np.inf), np.where(b > 0, g(0 * a, b, pos, neg), -np.inf))
        assert (both[valid] <= bound[valid] * (1 + 1e-12)).all(), (pos, neg)
        pure = g(np.arange(1, pos + 1, dtype=float), 0.0, pos, neg)
        assert (np.diff(pure[np.isfinite(pure)]) > 0).all()


def test_every_candidate_split_is_counted_as_a_brute_force_count_of_its_rows() -> None:
    """`_candidates` reads each group's negative entries, zero block and lowest positive value from prefix counts:
    every candidate ("rows <= an entry's value" and "rows <= 0") must hold the class counts, validity and Gini proxy
    that counting the node's rows by hand gives. Random nodes of signed values with ties, values within 1e-7 of 0,
    groups of only negative or only positive values, and nodes where a latent is non-zero on every row."""
    from pipeline.metrics.fms import _candidates

    rng = np.random.default_rng(3)
    for _ in range(20):
        n_nodes, n_latents = 3, 4
        rows = [rng.integers(2, 9) for _ in range(n_nodes)]
        entries = []  # (node, latent, value, positive)
        labels = [rng.random(r) < 0.5 for r in rows]
        codes = [np.where(rng.random((r, n_latents)) < 0.6, rng.choice([-2.0, -1.0, -5e-8, 5e-8, 1.0, 1.5, 3.0], (r, n_latents)), 0.0) for r in rows]
        codes[0][:, 0] = rng.choice([1.0, 2.0], rows[0])  # a latent without zeros on its node
        for node in range(n_nodes):
            for latent in range(n_latents):
                column = codes[node][:, latent]
                for row in np.flatnonzero(column)[np.argsort(column[np.flatnonzero(column)], kind="stable")]:
                    entries.append((node, latent, column[row], labels[node][row]))
        node, latent, value, positive = (torch.tensor([e[i] for e in entries]) for i in range(4))
        node_pos = torch.tensor([int(y.sum()) for y in labels])
        node_neg = torch.tensor([int((~y).sum()) for y in labels])
        cands, n_groups = _candidates(node, latent, value.to(torch.float64), positive, node_pos, node_neg)
        assert n_groups == len({(e[0], e[1]) for e in entries})
        valid = torch.isfinite(cands.proxy)
        for at in range(n_nodes):
            for column in range(n_latents):
                x, y = codes[at][:, column], labels[at]
                if not x.any():
                    continue
                # the splits by hand: each distinct value (0 too) with a distinct value above it, by more than 1e-7
                values = np.unique(x)
                expected = {float(v) for v, above in zip(values[:-1], values[1:]) if above > v + 1e-7}
                mine = _where_true(valid & (cands.node == at) & (cands.latent == column))
                assert sorted(float(cands.threshold[i]) for i in mine) == sorted(expected), (at, column)
                for i in mine:
                    left = x <= float(cands.threshold[i])
                    lp, ln = float((left & y).sum()), float((left & ~y).sum())
                    assert (float(cands.left_pos[i]), float(cands.left_neg[i])) == (lp, ln), (at, column)
                    rp, rn = float(y.sum()) - lp, float((~y).sum()) - ln
                    gini_left = 1.0 - (ln * ln + lp * lp) / ((lp + ln) * (lp + ln))
                    gini_right = 1.0 - (rn * rn + rp * rp) / ((rp + rn) * (rp + rn))
                    assert float(cands.proxy[i]) == -(rp + rn) * gini_right - (lp + ln) * gini_left, (at, column)


def _where_true(mask: torch.Tensor) -> list[int]:
    return torch.nonzero(mask).squeeze(1).tolist()


def test_the_pure_side_bound_is_the_squares_formula() -> None:
    """The roots' bounds come from `_pure_side` (fewer passes): the very numbers `_squares` gives for a right side of
    r rows of one class, for every node and r up to 40."""
    from pipeline.metrics.fms import _pure_side, _squares

    pos, neg = (t.to(torch.float64) for t in torch.meshgrid(torch.arange(1, 41), torch.arange(1, 41), indexing="ij"))
    for r in range(0, 41):
        right = torch.full_like(pos, float(r))
        expected_pos = torch.where((right > 0) & (right <= pos), _squares(right, torch.zeros_like(pos), pos, neg), -torch.inf)
        got_pos = torch.where(right <= pos, _pure_side(right, pos, neg), -torch.inf)
        assert torch.equal(got_pos, expected_pos), r
        expected_neg = torch.where((right > 0) & (right <= neg), _squares(torch.zeros_like(neg), right, pos, neg), -torch.inf)
        assert torch.equal(torch.where(right <= neg, _pure_side(right, neg, pos), -torch.inf), expected_neg), r


def test_the_drift_bound_that_carries_split_bounds_between_levels_holds() -> None:
    """A dense node that loses rows holding 0 on a latent keeps that latent's best split bounded by the old best plus
    `_drift`: every split (right side (rp, rn) of at most (mp, mn) rows, a non-empty left) gains at most that much in
    g = f(right) + f(left), f(a, b) = (a^2 + b^2) / (a + b). Checked for every node, moved rows and side up to 12."""
    from pipeline.metrics.fms import _drift

    f = lambda a, b: (a * a + b * b) / (a + b)  # noqa: E731
    worst = -np.inf
    for pos, neg, dp, dn in itertools.product(range(1, 13), range(1, 13), range(0, 5), range(0, 5)):
        if dp + dn == 0:
            continue
        rp, rn = np.meshgrid(np.arange(pos + 1.0), np.arange(neg + 1.0), indexing="ij")
        ok = (rp + rn > 0) & (rp + rn < pos + neg)  # both sides non-empty after the move
        with np.errstate(divide="ignore", invalid="ignore"):
            gain = np.where(ok, f(pos - rp, neg - rn) - f(pos + dp - rp, neg + dn - rn), -np.inf)  # the right side stays
        # the largest gain over the right sides of at most (mp, mn) rows, for every (mp, mn)
        most = np.maximum.accumulate(np.maximum.accumulate(gain, axis=0), axis=1)
        bound = _drift(*(torch.full(rp.shape, float(v)) for v in (pos, neg, dp, dn)), torch.tensor(rp), torch.tensor(rn)).numpy()
        assert (most <= bound + 1e-12).all(), (pos, neg, dp, dn)
        worst = max(worst, float((most - bound)[np.isfinite(most)].max()))
    assert worst > -0.5  # the bound is not vacuous: somewhere it is nearly reached


def test_entries_are_ordered_by_concept_then_rank_by_counting_sorts() -> None:
    """The block's entries are put in (concept, rank) order once: on the CPU by two counting sorts, elsewhere by an
    argsort; both are the argsort of the combined key, by hand and on 20,000 random distinct pairs."""
    from pipeline.metrics.fms import _pair_order

    major, minor = torch.tensor([1, 0, 1, 0, 2]), torch.tensor([0, 3, 2, 1, 0])
    assert _pair_order(major, minor, 3, 4).tolist() == [3, 1, 0, 2, 4]  # (0, 1), (0, 3), (1, 0), (1, 2), (2, 0)
    rng = np.random.default_rng(0)
    key = torch.as_tensor(rng.choice(50 * 7000, size=20_000, replace=False))
    major, minor = key // 7000, key % 7000
    assert torch.equal(_pair_order(major, minor, 50, 7000), torch.argsort(key))
    assert _pair_order(major[:0], minor[:0], 50, 7000).numel() == 0


def test_root_counts_are_each_concepts_class_counts_of_positive_values() -> None:
    """The dense roots' counts (segmented sums over the fixed order's runs) equal, per concept with a slot and latent,
    its positive and negative rows whose value is > 0 (negative values and zeros not counted), counted by hand in
    numpy; a concept without a slot leaves the pools alone."""
    from pipeline.metrics.fms import _fixed, _root_counts

    rng = np.random.default_rng(7)
    n_concepts, n_latents, n_samples = 5, 9, 60
    concept = np.sort(rng.integers(0, n_concepts, n_samples))
    concept[:n_concepts] = np.arange(n_concepts)
    concept.sort()
    positive = rng.random(n_samples) < 0.5
    values = np.where(rng.random((n_samples, n_latents)) < 0.4, rng.normal(size=(n_samples, n_latents)), 0.0)
    sample, latent = np.nonzero(values)  # grouped by sample, in sample order
    value = values[sample, latent]
    rank = np.empty(value.size, dtype=np.int64)
    rank[np.lexsort((value, latent))] = np.arange(value.size)  # (latent, value) order
    fixed = _fixed(torch.as_tensor(concept), torch.as_tensor(positive), torch.as_tensor(sample), torch.as_tensor(latent),
                   torch.as_tensor(value), torch.as_tensor(rank), n_samples, n_latents)
    slot = torch.tensor([2, -1, 0, 3, 1])  # concept 1 has no slot
    pool_pos, pool_neg = torch.zeros((4, n_latents), dtype=torch.int32), torch.zeros((4, n_latents), dtype=torch.int32)
    _root_counts(fixed, slot, pool_pos, pool_neg)
    expected_pos, expected_neg = np.zeros((4, n_latents), np.int64), np.zeros((4, n_latents), np.int64)
    for c, s in enumerate(slot.tolist()):
        if s >= 0:
            mine = concept == c
            expected_pos[s] = ((values[mine & positive] > 0)).sum(axis=0)
            expected_neg[s] = ((values[mine & ~positive] > 0)).sum(axis=0)
    np.testing.assert_array_equal(pool_pos.numpy(), expected_pos)
    np.testing.assert_array_equal(pool_neg.numpy(), expected_neg)
    assert expected_pos.sum() > 0 and expected_neg.sum() > 0 and (values < 0).any()


def test_memory_bounds_and_threads_change_nothing_but_the_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Concepts grown in blocks of a few entries, nodes searched through their entries instead of dense counts, one
    torch thread, and blocks grown side by side on three threads: the same numbers."""
    rng = np.random.default_rng(4)
    codes = rng.random((300, 30)) * (rng.random((300, 30)) < 0.2)
    labels = np.stack([codes[:, 0] > 0.1, rng.random(300) < 0.5, np.zeros(300, bool), (codes[:, 5] > 0) & (codes[:, 6] > 0)], axis=1)
    default = fms(codes, labels)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        small = fms(codes, labels, block_entries=50, dense_cells=30)
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    side_by_side = fms(codes, labels)
    for other in (small, side_by_side):
        for field in ("per_concept", "cut_accuracy", "root_feature", "depth", "n_rows", "global_", "local"):
            np.testing.assert_array_equal(getattr(default, field), getattr(other, field))
        assert default.fms == other.fms
    assert np.isnan(default.per_concept[2])


def test_code_sets_grown_together_score_as_each_set_alone(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """`fms_of_sets` grows the trees of several code sets in shared blocks: each set gets exactly what `fms` gives it
    alone, in one block or many, on one thread or three, with sets of different widths (a binary one, an all-zero
    one whose concepts are undefined) and a single-class concept."""
    rng = np.random.default_rng(11)
    n = 240
    dense = rng.random((n, 24)) * (rng.random((n, 24)) < 0.25)
    binary = (rng.random((n, 40)) < 0.1).astype(np.float32)
    zero = np.zeros((n, 8))
    labels = np.stack([dense[:, 3] > 0.2, rng.random(n) < 0.5, np.zeros(n, bool), (dense[:, 1] > 0) | (binary[:, 7] > 0)], axis=1)
    sets = [dense, binary, zero]
    alone = [fms(codes, labels, max_n=160, seed=2) for codes in sets]
    together = [fms_of_sets(sets, labels, max_n=160, seed=2)]
    together.append(fms_of_sets(sets, labels, max_n=160, seed=2, block_entries=300, dense_cells=50))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    with caplog.at_level("WARNING"):
        together.append(fms_of_sets(sets, labels, max_n=160, seed=2))
    for results in together:
        assert len(results) == 3
        for one, other in zip(alone, results):
            for field in ("per_concept", "root_accuracy", "local", "global_", "root_feature", "depth", "cut_accuracy", "n_rows"):
                np.testing.assert_array_equal(getattr(one, field), getattr(other, field))
            assert one.fms == other.fms or (np.isnan(one.fms) and np.isnan(other.fms))
    assert np.isfinite(alone[0].fms) and np.isfinite(alone[1].fms) and not np.isfinite(alone[2].fms)
    assert np.isnan(alone[0].per_concept[2]), "a single class on its rows"
    assert alone[1].root_feature.max() < 40 and (alone[2].root_feature == -1).all()
    assert "fms (code set 2): concept 0: no latent separates" in caplog.text


def test_code_sets_must_be_a_sequence_of_code_arrays_of_the_same_rows() -> None:
    y = np.array([1, 0] * 4, dtype=bool)
    with pytest.raises(TypeError, match="code_sets"):
        fms_of_sets(np.ones((8, 3)), y)
    with pytest.raises(TypeError, match="code_sets"):
        fms_of_sets([], y)
    with pytest.raises(ValueError, match=r"code_sets\[1\]: expected 8 rows"):
        fms_of_sets([np.ones((8, 3)), np.ones((6, 3))], y)
    bad = np.ones((8, 3))
    bad[2, 1] = np.inf
    with pytest.raises(ValueError, match=r"code_sets\[1\]: contains NaN"):
        fms_of_sets([np.ones((8, 3)), bad], y)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_gives_the_cpus_numbers() -> None:
    rng = np.random.default_rng(5)
    codes, y = _random_case(rng, 400, 200, 8, grid=True)
    labels = np.stack([y, rng.random(400) < 0.4], axis=1)
    cpu, cuda = fms(codes, labels), fms(codes, labels, device="cuda")
    for field in ("per_concept", "cut_accuracy", "root_feature", "depth"):
        np.testing.assert_array_equal(getattr(cpu, field), getattr(cuda, field))


def test_available_threads_is_the_processes_share(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.metrics.threads import available_threads

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert available_threads() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert available_threads() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("OMP_NUM_THREADS", "zero")  # not a count: ignored
    assert available_threads() == len(os.sched_getaffinity(0))


def test_thread_map_keeps_the_order_on_any_number_of_threads() -> None:
    from pipeline.metrics.threads import thread_map

    for jobs in (1, 3, None):
        assert thread_map(lambda i: i * i, range(7), jobs) == [0, 1, 4, 9, 16, 25, 36]
    assert thread_map(lambda i: i, [], 4) == []


def test_thread_map_workers_share_the_budget_and_leave_the_callers_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each worker's torch operations get budget // jobs threads (at least one); the caller keeps its own count."""
    import threading

    from pipeline.metrics.threads import thread_map

    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    before = torch.get_num_threads()
    barrier = threading.Barrier(2)  # both items on their own worker at once

    def seen(_: int) -> int:
        barrier.wait(timeout=10)
        return torch.get_num_threads()

    assert thread_map(seen, range(2)) == [2, 2], "2 workers of a budget of 4: 2 threads each"
    assert thread_map(seen, range(2), 2) == [2, 2]
    assert thread_map(lambda _: torch.get_num_threads(), range(3), 3) == [1, 1, 1], "4 // 3"
    assert thread_map(lambda _: torch.get_num_threads(), range(8), 8) == [1] * 8, "never fewer than one"
    assert torch.get_num_threads() == before


def test_bad_inputs_raise_clear_errors() -> None:
    codes = np.ones((8, 3))
    y = np.array([1, 0] * 4, dtype=bool)
    with pytest.raises(TypeError, match="bool"):
        fms(codes, y.astype(int))
    with pytest.raises(ValueError, match="labels"):
        fms(codes, y[:5])
    bad = codes.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        fms(bad, y)
    with pytest.raises(ValueError, match="removals"):
        fms(codes, y, removals=0)
    with pytest.raises(ValueError, match="levels"):
        fms(codes, y, levels="notebook")
    with pytest.raises(ValueError, match="exhausted"):
        fms(codes, y, exhausted="zero")
    with pytest.raises(ValueError, match="codes"):
        fms(np.ones(8), y)


def test_blocks_are_one_per_thread_of_about_equal_entries_and_cut_only_at_the_bounds() -> None:
    from pipeline.metrics.fms import _blocks, _parts

    # as many blocks as threads, or whole rounds of them where the entries need more
    assert [_parts(entries, 2, 100) for entries in (0, 50, 200, 201, 399, 401)] == [2, 2, 2, 4, 4, 6]
    assert _parts(250, 1, 100) == 3 and _parts(250, 3, 100) == 3 and _parts(301, 3, 100) == 6

    # filling each block up to half the total (10) would leave a third one: [4, 4], [4, 4], [3]
    assert [b.tolist() for b in _blocks(np.array([4, 4, 4, 4, 3]), 2, 1000, 100)] == [[0, 1], [2, 3, 4]]
    sizes = np.array([5, 5, 5, 5, 5, 6])
    assert [b.tolist() for b in _blocks(sizes, 2, 1000, 100)] == [[0, 1, 2], [3, 4, 5]]
    assert [b.tolist() for b in _blocks(sizes, 3, 1000, 100)] == [[0, 1], [2, 3], [4, 5]]
    assert [b.tolist() for b in _blocks(sizes, 2, 10, 100)] == [[0, 1], [2], [3, 4], [5]], "at most 10 entries a block"
    assert [b.tolist() for b in _blocks(sizes, 1, 1000, 2)] == [[0, 1], [2, 3], [4, 5]], "at most 2 concepts a block"
    assert [b.tolist() for b in _blocks(np.array([100, 1, 1]), 2, 50, 100)] == [[0], [1, 2]], "a concept above the limit alone"
    assert _blocks(np.zeros(0, np.int64), 2, 10, 10) == []
    # every index once, in order, whatever the sizes
    rng = np.random.default_rng(0)
    for parts in (1, 2, 3, 5):
        sizes = rng.integers(1, 50, size=37)
        blocks = _blocks(sizes, parts, 10**9, 10**9)
        assert np.concatenate(blocks).tolist() == list(range(37)) and len(blocks) <= parts
