"""Tests for pipeline.metrics.probe: linear probes of several families fitted at once with torch (scikit-learn's
LogisticRegression is the reference), their cross-entropy, KL and accuracy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from pipeline.metrics.probe import ProbeResult, Probes, fit_probes, probe_scores


def _blobs(n_per_class: int, seed: int, classes: int = 3, d: int = 4, spread: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = 3.0 * np.eye(max(classes, d))[:classes, :d]
    y = np.repeat(np.arange(classes), n_per_class)
    x = centres[y] + spread * rng.normal(size=(y.size, d))
    return x.astype(np.float32), y


def _families(n: int, d: int, sizes: list[int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings that carry several overlapping one-hot families (a centre per value, summed, plus noise)."""
    rng = np.random.default_rng(seed)
    labels = np.stack([rng.integers(0, k, n) for k in sizes], axis=1)
    centres = [rng.normal(size=(k, d)) for k in sizes]
    x = sum(c[labels[:, f]] for f, c in enumerate(centres)) + 1.5 * rng.normal(size=(n, d))
    return x.astype(np.float32), labels


def test_probe_scores_hand_computed() -> None:
    # One two-class family whose probe is set by hand: logits (0, x), so p(class 1 | x) = sigmoid(x).
    probes = Probes(classes=(np.array([0, 1]),), weight=torch.tensor([[0.0, 1.0]], dtype=torch.float64),
                    bias=torch.zeros(2, dtype=torch.float64), columns=torch.tensor([[0, 1]]), real=torch.tensor([[True, True]]), iterations=0)
    x = np.zeros((2, 1))  # p = (1/2, 1/2)
    x_hat = np.full((2, 1), math.log(3.0))  # p = (1/4, 3/4)
    (result,) = probe_scores(probes, x, x_hat, np.array([1, 1]))
    assert result.ce_original == pytest.approx(math.log(2.0), abs=1e-12)
    assert result.ce_reconstruction == pytest.approx(math.log(4.0 / 3.0), abs=1e-12)
    assert result.kl == pytest.approx(0.5 * math.log(2.0) + 0.5 * math.log(2.0 / 3.0), abs=1e-12)
    assert result.accuracy_original == 0.0  # the 1/2-1/2 tie goes to the first class, 0
    assert result.accuracy_reconstruction == 1.0
    assert result.n == 2


def test_identical_reconstruction_has_zero_kl_and_equal_scores() -> None:
    x, y = _blobs(40, seed=0)
    (result,) = probe_scores(fit_probes(x, y), x, x.copy(), y)
    assert isinstance(result, ProbeResult)
    assert result.kl == pytest.approx(0.0, abs=1e-12)
    assert result.ce_reconstruction == result.ce_original
    assert result.accuracy_original == result.accuracy_reconstruction > 0.9


def test_noisy_reconstruction_raises_cross_entropy_and_kl() -> None:
    x, y = _blobs(60, seed=1)
    probes = fit_probes(x[::2], y[::2])
    x_test, y_test = x[1::2], y[1::2]
    noisy = x_test + np.random.default_rng(2).normal(scale=3.0, size=x_test.shape).astype(np.float32)
    (result,) = probe_scores(probes, x_test, noisy, y_test)
    assert result.ce_original < result.ce_reconstruction
    assert result.kl > 0.1
    assert result.accuracy_original > result.accuracy_reconstruction


@pytest.mark.parametrize("seed", range(3))
def test_scores_within_5e_3_of_scikit_learns_probes(seed: int) -> None:
    """Families of 2 to 9 classes on overlapping embeddings: each family's cross-entropies and accuracies on held-out
    originals and noisy reconstructions are within 0.005 of scikit-learn's LogisticRegression (C = 1, max_iter 1000: the settings this project used) and
    closer still to scikit-learn run to convergence (the same objective: both minimise it)."""
    x, labels = _families(1500, 24, [2, 4, 9, 3], seed)
    train, test = slice(0, 1000), slice(1000, None)
    x_hat = x[test] + np.random.default_rng(seed).normal(scale=0.7, size=x[test].shape).astype(np.float32)
    ours = probe_scores(fit_probes(x[train], labels[train]), x[test], x_hat, labels[test])
    for f, result in enumerate(ours):
        for reference, tolerance in ((LogisticRegression(max_iter=1000), 5e-3), (LogisticRegression(tol=1e-10, max_iter=10_000), 1e-3)):
            probe = reference.fit(x[train].astype(np.float64), labels[train, f])
            y = np.searchsorted(probe.classes_, labels[test, f])
            rows = np.arange(y.size)
            log_p, log_q = probe.predict_log_proba(x[test].astype(np.float64)), probe.predict_log_proba(x_hat.astype(np.float64))
            expected = {"ce_original": -log_p[rows, y].mean(), "ce_reconstruction": -log_q[rows, y].mean(),
                        "accuracy_original": np.mean(log_p.argmax(axis=1) == y), "accuracy_reconstruction": np.mean(log_q.argmax(axis=1) == y)}
            for field, value in expected.items():
                assert getattr(result, field) == pytest.approx(value, abs=tolerance), (f, field, tolerance)


def test_a_two_class_family_has_scikit_learns_single_logistic_vector() -> None:
    """scikit-learn fits one vector w for two classes (penalty |w|^2 / 2C); our two-class softmax head, its penalty
    doubled, reaches the same probabilities: w = w_1 - w_0."""
    x, y = _blobs(80, seed=5, classes=2, spread=2.0)
    probes = fit_probes(x, y, tol=1e-9, dtype=torch.float64)
    reference = LogisticRegression(tol=1e-12, max_iter=10_000).fit(x.astype(np.float64), y)
    w = (probes.weight[:, 1] - probes.weight[:, 0]).numpy()
    np.testing.assert_allclose(w, reference.coef_[0], rtol=1e-4, atol=1e-5)
    assert float(probes.bias[1] - probes.bias[0]) == pytest.approx(reference.intercept_[0], abs=1e-4)


def test_families_fitted_together_score_as_fitted_alone() -> None:
    """The families' objectives do not interact: one model with a head per family gives every family the scores of
    its own probe."""
    x, labels = _families(600, 12, [3, 5], seed=7)
    together = probe_scores(fit_probes(x, labels, tol=1e-9, dtype=torch.float64), x, x[::-1].copy(), labels)
    for f in range(2):
        (alone,) = probe_scores(fit_probes(x, labels[:, f], tol=1e-9, dtype=torch.float64), x, x[::-1].copy(), labels[:, f])
        for field in ("ce_original", "ce_reconstruction", "kl", "accuracy_original", "accuracy_reconstruction"):
            assert getattr(together[f], field) == pytest.approx(getattr(alone, field), rel=1e-5, abs=1e-6)


def test_rows_of_a_class_the_probe_never_saw_are_left_out_of_that_family() -> None:
    x, y = _blobs(30, seed=3)
    probes = fit_probes(x[y < 2], y[y < 2])  # class 2 never seen
    (result,) = probe_scores(probes, x, x, y)
    (seen,) = probe_scores(probes, x[y < 2], x[y < 2], y[y < 2])
    assert result.n == seen.n == 60
    for field in ("ce_original", "ce_reconstruction", "kl", "accuracy_original", "accuracy_reconstruction"):
        assert getattr(result, field) == pytest.approx(getattr(seen, field), abs=1e-12)
    (none,) = probe_scores(probes, x[y == 2], x[y == 2], y[y == 2])
    assert none.n == 0 and np.isnan(none.ce_original)


def test_fit_is_deterministic_and_multiclass() -> None:
    x, y = _blobs(30, seed=3)
    a, b = fit_probes(x, y, c=0.5, max_iter=500), fit_probes(x, y, c=0.5, max_iter=500)
    assert a.weight.shape == (4, 3) and a.iterations >= 1
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_fits_the_cpus_probes() -> None:
    x, labels = _families(800, 16, [3, 6], seed=9)
    cpu = probe_scores(fit_probes(x, labels), x, x[::-1].copy(), labels)
    cuda = probe_scores(fit_probes(x, labels, device="cuda"), x, x[::-1].copy(), labels)
    for a, b in zip(cpu, cuda):
        assert a.ce_original == pytest.approx(b.ce_original, abs=1e-4) and a.accuracy_original == pytest.approx(b.accuracy_original, abs=5e-3)


def test_bad_inputs_raise_clear_errors() -> None:
    x, y = _blobs(10, seed=4)
    with pytest.raises(ValueError, match="2 distinct"):
        fit_probes(x, np.zeros(30, dtype=int))
    with pytest.raises(TypeError, match="integer"):
        fit_probes(x, y.astype(float))
    with pytest.raises(ValueError, match="labels"):
        fit_probes(x, y[:5])
    with pytest.raises(ValueError, match="c:"):
        fit_probes(x, y, c=0.0)
    probes = fit_probes(x, y)
    with pytest.raises(ValueError, match="x_hat"):
        probe_scores(probes, x, x[:, :3], y)
    with pytest.raises(ValueError, match="families"):
        probe_scores(probes, x, x, np.stack([y, y], axis=1))
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        probe_scores(probes, x, bad, y)
    with pytest.raises(TypeError, match="fitted"):
        probe_scores(object(), x, x, y)  # type: ignore[arg-type]
