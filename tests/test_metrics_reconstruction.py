"""Tests for pipeline.metrics.reconstruction: FVU, L0, dead fraction, streaming accumulator."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.metrics.reconstruction import (
    ReconstructionAccumulator,
    ReconstructionStats,
    dead_fraction,
    fvu,
    l0,
)


def test_fvu_hand_computed() -> None:
    # mean = (1, 1); sum ||x - mean||^2 = 4 * 2 = 8; squared error = 1 + 1 = 2 -> FVU = 0.25
    x = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [2.0, 2.0]])
    x_hat = x + np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    assert fvu(x, x_hat) == 0.25


def test_fvu_of_perfect_reconstruction_is_zero_and_of_the_mean_is_one() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 7)).astype(np.float32)
    assert fvu(x, x) == 0.0
    mean = np.broadcast_to(x.astype(np.float64).mean(axis=0), x.shape)
    assert fvu(x, mean) == pytest.approx(1.0, abs=1e-12)


def test_l0_and_dead_fraction_hand_computed() -> None:
    codes = np.array([[0.0, 1.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0], [3.0, 0.0, 0.0, 0.0], [1.0, -1.0, 0.0, 0.0]])
    assert l0(codes) == 1.25  # (2 + 0 + 1 + 2) / 4 rows
    assert dead_fraction(codes) == 0.25  # column 3 is never non-zero
    assert dead_fraction(np.zeros((3, 5))) == 1.0
    assert l0(np.ones((3, 5), dtype=bool)) == 5.0


def _batches(rng: np.random.Generator, sizes: list[int], d: int, n_latents: int, offset: float, scale: float):
    for size in sizes:
        x = offset + scale * rng.normal(size=(size, d))
        x_hat = x + 0.3 * scale * rng.normal(size=(size, d))
        codes = rng.normal(size=(size, n_latents)) * (rng.random((size, n_latents)) < 0.2)
        yield x, x_hat, codes


@pytest.mark.parametrize(("offset", "scale"), [(0.0, 1.0), (100.0, 1.0), (1.0e4, 1.0e-2)])
def test_streaming_equals_batch_to_1e9(offset: float, scale: float) -> None:
    # The last case has a mean 1e6 times the spread: the unshifted formula
    # sum||x||^2 - n||mean||^2 loses ~12 digits there; the shifted one keeps them.
    rng = np.random.default_rng(1)
    batches = list(_batches(rng, [17, 64, 5, 30, 1], d=6, n_latents=9, offset=offset, scale=scale))
    acc = ReconstructionAccumulator(d=6, n_latents=9)
    for x, x_hat, codes in batches:
        acc.update(x, x_hat, codes)
    stats = acc.result()
    x_all = np.concatenate([b[0] for b in batches])
    x_hat_all = np.concatenate([b[1] for b in batches])
    codes_all = np.concatenate([b[2] for b in batches])
    assert isinstance(stats, ReconstructionStats)
    assert stats.n == 117
    assert abs(stats.fvu - fvu(x_all, x_hat_all)) <= 1e-9 * fvu(x_all, x_hat_all)
    assert stats.l0 == pytest.approx(l0(codes_all), abs=1e-12)
    assert stats.dead_fraction == dead_fraction(codes_all)


def test_streaming_hand_computed_and_float32_input() -> None:
    x = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [2.0, 2.0]], dtype=np.float32)
    x_hat = x + np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    codes = np.array([[1.0, 0.0, 0.0], [1.0, 2.0, 0.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    acc = ReconstructionAccumulator(d=2, n_latents=3)
    acc.update(x[:1], x_hat[:1], codes[:1])
    acc.update(x[1:], x_hat[1:], codes[1:])
    assert acc.result() == ReconstructionStats(fvu=0.25, l0=1.0, dead_fraction=1 / 3, n=4)


def test_bad_inputs_raise_clear_errors() -> None:
    x = np.ones((4, 3))
    with pytest.raises(ValueError, match="x_hat"):
        fvu(x, np.ones((4, 2)))
    with pytest.raises(ValueError, match="zero total variance"):
        fvu(x, x)
    bad = np.arange(12.0).reshape(4, 3)
    bad[1, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        fvu(bad, bad)
    with pytest.raises(ValueError, match="2-D"):
        l0(np.ones(5))
    with pytest.raises(ValueError, match="non-empty"):
        dead_fraction(np.ones((0, 3)))
    with pytest.raises(TypeError, match="numeric"):
        l0(np.array([["a"]]))
    with pytest.raises(ValueError, match="n_latents"):
        ReconstructionAccumulator(d=3, n_latents=0)
    acc = ReconstructionAccumulator(d=3, n_latents=2)
    with pytest.raises(ValueError, match="no batch"):
        acc.result()
    with pytest.raises(ValueError, match="codes"):
        acc.update(np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 5)))
    with pytest.raises(ValueError, match="columns"):
        acc.update(np.ones((2, 4)), np.ones((2, 4)), np.ones((2, 2)))
