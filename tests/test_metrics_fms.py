"""Tests for pipeline.metrics.fms: the Feature Monosemanticity Score (Härle et al. 2025)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from sklearn.tree import DecisionTreeClassifier

from pipeline.metrics import fms as fms_module
from pipeline.metrics.fms import FMSResult, fms, truncated_accuracies


def test_perfectly_monosemantic_latent_scores_one_by_the_papers_formula() -> None:
    # Latent 0 is the concept; latent 1 is always off. Root split is perfect (accs_0 = 1), no deeper
    # level (global = 1); without latent 0 nothing can split: majority 4/8 = 0.5 -> local = 2 (1 - 0.5) = 1.
    y = np.array([1, 1, 1, 1, 0, 0, 0, 0], dtype=bool)
    codes = np.stack([y.astype(float), np.zeros(8)], axis=1)
    result = fms(codes, y, removals=1, levels="paper")
    assert isinstance(result, FMSResult)
    assert result.fms == 1.0
    assert result.root_accuracy.tolist() == [1.0]
    assert result.local.tolist() == [1.0]
    assert result.global_.tolist() == [1.0]
    assert result.root_feature.tolist() == [0]
    assert result.depth.tolist() == [1]


def test_published_convention_hand_computed() -> None:
    # The published code's global term also averages the no-split level: majority accuracy 0.5, a term
    # 0.5 - 1 = -0.5, so FMS_global = 1 - (-0.5) / 1 = 1.5; the local term is averaged over 1..9 removals, all 1
    # (nothing can split once latent 0 is gone). FMS = 1 * (1 + 1.5) / 2 = 1.25: above 1, as published.
    y = np.array([1, 1, 1, 1, 0, 0, 0, 0], dtype=bool)
    codes = np.stack([y.astype(float), np.zeros(8)], axis=1)
    result = fms(codes, y)
    assert (result.removals, result.levels) == (tuple(range(1, 10)), "published")
    assert result.global_.tolist() == [1.5] and result.local.tolist() == [1.0]
    assert result.fms == 1.25


def test_concept_split_over_two_latents_hand_computed() -> None:
    # y = a OR b: latent a covers 3 positives, latent b the 4th; 4 negatives. Gini picks a at the root
    # (weighted impurity 1/5 vs 3/7). accs_0 = (3 + 4)/8 = 7/8; depth 2 reaches 1.0, so
    # global = 1 - (1 - 7/8)/1 = 7/8. Without a the stump on b gets (1 + 4)/8 = 5/8: local@1 = 2 (7/8 - 5/8) = 1/2;
    # without b too nothing splits: 4/8, local@2 = 2 (7/8 - 1/2) = 3/4.
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
    two = fms(codes, y, removals=2, levels="paper")
    assert two.cut_accuracy[0].tolist() == [7 / 8, 5 / 8, 0.5]
    assert two.fms == pytest.approx(7 / 8 * (0.75 + 7 / 8) / 2, abs=1e-15)  # 0.7109375
    # Published: levels {no split 0.5, depth 2 1.0} -> global = 1 - mean(0.5 - 7/8, 1 - 7/8) = 9/8; removals 1..9:
    # accuracies 5/8 then 0.5 (nothing splits after two removals) -> local = (0.5 + 8 * 0.75) / 9 = 13/18.
    published = fms(codes, y)
    assert published.global_[0] == pytest.approx(9 / 8, abs=1e-15)
    assert published.local[0] == pytest.approx(13 / 18, abs=1e-15)
    assert published.fms == pytest.approx(7 / 8 * (13 / 18 + 9 / 8) / 2, abs=1e-15)  # 0.80815972...


def test_constant_concept_is_nan_and_excluded_from_the_mean() -> None:
    y = np.array([1, 1, 1, 1, 0, 0, 0, 0], dtype=bool)
    codes = np.stack([y.astype(float), np.zeros(8)], axis=1)
    labels = np.stack([y, np.zeros(8, dtype=bool)], axis=1)
    result = fms(codes, labels, removals=1, levels="paper")
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
    balanced = fms(codes, y, removals=1, levels="paper")
    assert balanced.n_rows.tolist() == [20]
    assert balanced.fms == 1.0
    assert fms(codes, y, removals=1, levels="paper", balanced=False).fms == pytest.approx(0.55, abs=1e-12)


def test_truncated_accuracies_match_depth_limited_trees() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 6)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] * x[:, 2] + 0.3 * rng.normal(size=300)) > 0
    full = DecisionTreeClassifier(random_state=0).fit(x, y)
    acc = truncated_accuracies(full)
    assert acc.size == full.get_depth()
    assert acc[-1] == 1.0  # fully grown on distinct rows: every leaf is pure
    assert np.all(np.diff(acc) >= 0)  # deeper cuts never lose training accuracy
    for depth in (1, 2, 3, 5):
        limited = DecisionTreeClassifier(max_depth=depth, random_state=0).fit(x, y)
        assert acc[depth - 1] == pytest.approx(limited.score(x, y), abs=1e-12)


def test_scores_are_bounded_and_subsample_is_seeded() -> None:
    rng = np.random.default_rng(1)
    codes = rng.random((400, 20)) * (rng.random((400, 20)) < 0.3)
    labels = np.stack([codes[:, 0] > 0.2, rng.random(400) < 0.5, (codes[:, 1] > 0) | (codes[:, 2] > 0)], axis=1)
    result = fms(codes, labels, max_n=250, seed=3)
    assert np.all(result.n_rows <= 250) and np.all(result.n_rows % 2 == 0)  # balanced: as many negatives as positives
    assert fms(codes, labels, max_n=250, seed=3, balanced=False).n_rows.tolist() == [250, 250, 250]
    assert np.all((result.root_accuracy >= 0.5) & (result.root_accuracy <= 1.0))
    assert np.all(result.global_ >= 0.5)
    paper = fms(codes, labels, max_n=250, seed=3, levels="paper")
    assert np.all((paper.global_ >= 0.5) & (paper.global_ <= 1.0))
    assert np.all(result.global_ >= paper.global_)  # the no-split level only ever adds a negative term
    # The planted single-latent concept scores above the random one.
    assert result.per_concept[0] > result.per_concept[1]
    again = fms(codes, labels, max_n=250, seed=3)
    np.testing.assert_array_equal(result.per_concept, again.per_concept)


def test_threads_change_nothing_but_the_time() -> None:
    rng = np.random.default_rng(4)
    codes = rng.random((300, 30)) * (rng.random((300, 30)) < 0.2)
    labels = np.stack([codes[:, 0] > 0.1, rng.random(300) < 0.5, np.zeros(300, bool), (codes[:, 5] > 0) & (codes[:, 6] > 0)], axis=1)
    one, four = fms(codes, labels, n_jobs=1), fms(codes, labels, n_jobs=4)
    for field in ("per_concept", "cut_accuracy", "root_feature", "depth", "n_rows"):
        np.testing.assert_array_equal(getattr(one, field), getattr(four, field))
    assert one.fms == four.fms and np.isnan(one.per_concept[2])


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


def test_sparse_and_dense_paths_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(2)
    codes = rng.random((300, 40)) * (rng.random((300, 40)) < 0.1)
    labels = np.stack([(codes[:, 3] > 0) | (codes[:, 4] > 0.5), rng.random(300) < 0.4], axis=1)
    sparse_result = fms(codes, labels, removals=3)  # 10% non-zeros: sparse path
    monkeypatch.setattr(fms_module, "_SPARSE_DENSITY", 0.0)
    dense_result = fms(codes, labels, removals=3)
    np.testing.assert_array_equal(sparse_result.cut_accuracy, dense_result.cut_accuracy)
    np.testing.assert_array_equal(sparse_result.per_concept, dense_result.per_concept)
    np.testing.assert_array_equal(sparse_result.root_feature, dense_result.root_feature)


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
    with pytest.raises(ValueError, match="codes"):
        fms(np.ones(8), y)
