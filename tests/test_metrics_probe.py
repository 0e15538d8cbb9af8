"""Tests for pipeline.metrics.probe: linear-probe cross-entropy, KL and accuracy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.metrics.probe import ProbeResult, fit_probe, probe_scores


def _blobs(n_per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = np.array([[3.0, 0.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0], [0.0, 0.0, 3.0, 0.0]])
    y = np.repeat(np.arange(3), n_per_class)
    x = centres[y] + rng.normal(size=(y.size, 4))
    return x.astype(np.float32), y


def test_probe_scores_hand_computed() -> None:
    # A fitted binary probe whose weights are then set by hand: p(class 1 | x) = sigmoid(x).
    probe = fit_probe(np.array([[-1.0], [1.0], [-2.0], [2.0]]), np.array([0, 1, 0, 1]))
    probe.coef_ = np.array([[1.0]])
    probe.intercept_ = np.array([0.0])
    x = np.zeros((2, 1))  # p = (1/2, 1/2)
    x_hat = np.full((2, 1), math.log(3.0))  # p = (1/4, 3/4)
    y = np.array([1, 1])
    result = probe_scores(probe, x, x_hat, y)
    assert result.ce_original == pytest.approx(math.log(2.0), abs=1e-12)
    assert result.ce_reconstruction == pytest.approx(math.log(4.0 / 3.0), abs=1e-12)
    assert result.kl == pytest.approx(0.5 * math.log(2.0) + 0.5 * math.log(2.0 / 3.0), abs=1e-12)
    assert result.accuracy_original == 0.0  # the 1/2-1/2 tie goes to the first class, 0
    assert result.accuracy_reconstruction == 1.0


def test_identical_reconstruction_has_zero_kl_and_equal_scores() -> None:
    x, y = _blobs(40, seed=0)
    probe = fit_probe(x, y, seed=0)
    result = probe_scores(probe, x, x.copy(), y)
    assert isinstance(result, ProbeResult)
    assert result.kl == pytest.approx(0.0, abs=1e-12)
    assert result.ce_reconstruction == result.ce_original
    assert result.accuracy_original == result.accuracy_reconstruction > 0.9


def test_noisy_reconstruction_raises_cross_entropy_and_kl() -> None:
    x, y = _blobs(60, seed=1)
    probe = fit_probe(x[::2], y[::2], seed=0)
    x_test, y_test = x[1::2], y[1::2]
    noisy = x_test + np.random.default_rng(2).normal(scale=3.0, size=x_test.shape).astype(np.float32)
    result = probe_scores(probe, x_test, noisy, y_test)
    assert result.ce_original < result.ce_reconstruction
    assert result.kl > 0.1
    assert result.accuracy_original > result.accuracy_reconstruction


def test_fit_probe_is_deterministic_and_multiclass() -> None:
    x, y = _blobs(30, seed=3)
    a = fit_probe(x, y, seed=0, c=0.5, max_iter=500)
    b = fit_probe(x, y, seed=0, c=0.5, max_iter=500)
    assert a.coef_.shape == (3, 4)
    np.testing.assert_array_equal(a.coef_, b.coef_)


def test_bad_inputs_raise_clear_errors() -> None:
    x, y = _blobs(10, seed=4)
    with pytest.raises(ValueError, match="2 distinct"):
        fit_probe(x, np.zeros(30, dtype=int))
    with pytest.raises(TypeError, match="integer"):
        fit_probe(x, y.astype(float))
    with pytest.raises(ValueError, match="y_train"):
        fit_probe(x, y[:5])
    with pytest.raises(ValueError, match="c:"):
        fit_probe(x, y, c=0.0)
    probe = fit_probe(x, y)
    with pytest.raises(ValueError, match="not seen"):
        probe_scores(probe, x, x, np.full(30, 7))
    with pytest.raises(ValueError, match="x_test_hat"):
        probe_scores(probe, x, x[:, :3], y)
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        probe_scores(probe, x, bad, y)
    with pytest.raises(TypeError, match="fitted"):
        probe_scores(object(), x, x, y)  # type: ignore[arg-type]
