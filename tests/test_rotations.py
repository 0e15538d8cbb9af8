"""Rotation baselines and the shared rotation machinery (pipeline.models.rotations)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from scipy.stats import ortho_group

from pipeline.data.planted import planted
from pipeline.metrics.recovery import axis_recovery
from pipeline.models.checkpoint import load_model, save_model
from pipeline.models.registry import build
from pipeline.models.rotations import (
    ICABasis,
    IdentityBasis,
    PCABasis,
    RandomRotation,
    fix_signs,
    orthogonal_polar_factor,
    topk_abs,
)

BASELINES = ["identity", "pca", "ica", "random_rotation"]


def fitted(method: str, x: np.ndarray, k: int, seed: int = 0):
    model = build(method, d=x.shape[1], dict_size=x.shape[1], k=k, seed=seed)
    model.fit_init(torch.as_tensor(x))
    return model.eval()


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    return planted(600, 8, 2, noise=0.01, seed=3).x


# --- topk_abs and helpers ----------------------------------------------------------------
def test_topk_abs_keeps_largest_magnitudes_with_signs() -> None:
    z = torch.tensor([[3.0, -5.0, 1.0, -2.0], [0.5, -0.25, -4.0, 2.0]])
    assert torch.equal(topk_abs(z, 2), torch.tensor([[3.0, -5.0, 0.0, 0.0], [0.0, 0.0, -4.0, 2.0]]))
    assert torch.equal(topk_abs(z, 1), torch.tensor([[0.0, -5.0, 0.0, 0.0], [0.0, 0.0, -4.0, 0.0]]))
    assert torch.equal(topk_abs(z, 4), z)


def test_topk_abs_gradient_reaches_kept_entries_only() -> None:
    z = torch.tensor([[3.0, -5.0, 1.0, -2.0]], requires_grad=True)
    topk_abs(z, 2).sum().backward()
    assert torch.equal(z.grad, torch.tensor([[1.0, 1.0, 0.0, 0.0]]))


def test_random_rotation_is_orthogonal_seeded_and_unbiased() -> None:
    q = build("random_rotation", 12, 12, 2, seed=5).rotation
    np.testing.assert_allclose(q @ q.T, np.eye(12), atol=1e-5)
    np.testing.assert_array_equal(q, build("random_rotation", 12, 12, 2, seed=5).rotation)
    assert not np.allclose(q, build("random_rotation", 12, 12, 2, seed=6).rotation)
    # Haar: no sign bias on the diagonal (a plain QR's Q has one)
    diag = np.stack([np.diag(build("random_rotation", 4, 4, 2, seed=s).rotation) for s in range(400)])
    assert abs(diag.mean()) < 0.06


def test_fix_signs_makes_largest_entry_positive() -> None:
    r = np.array([[0.6, -0.8], [-0.8, -0.6]])
    np.testing.assert_array_equal(fix_signs(r), np.array([[-0.6, 0.8], [0.8, 0.6]]))


def test_orthogonal_polar_factor_of_scaled_rotation_is_the_rotation() -> None:
    c, s = math.cos(0.3), math.sin(0.3)
    r = np.array([[c, -s], [s, c]])
    np.testing.assert_allclose(orthogonal_polar_factor(r @ np.diag([2.0, 2.0])), r, atol=1e-12)


# --- hand-computed encode/decode ------------------------------------------------------------
def test_identity_basis_hand_case() -> None:
    model = IdentityBasis(d=3, n_latents=3, k=2)
    model.mean = np.array([1.0, 0.0, -1.0])
    x = np.array([[2.0, -3.0, 0.5]], dtype=np.float32)  # x - b = [1, -3, 1.5]
    np.testing.assert_array_equal(model.encode(x), np.array([[0.0, -3.0, 1.5]], dtype=np.float32))
    np.testing.assert_array_equal(model(torch.as_tensor(x)).numpy(), np.array([[1.0, -3.0, 0.5]], dtype=np.float32))
    np.testing.assert_array_equal(model.encode(x, k=1), np.array([[0.0, -3.0, 0.0]], dtype=np.float32))


def test_assigned_rotation_hand_case() -> None:
    model = IdentityBasis(d=2, n_latents=2, k=1)
    h = 1 / math.sqrt(2)
    model.rotation = np.array([[h, h], [h, -h]])
    x = np.array([[3.0, 1.0]], dtype=np.float32)  # rotated: [4/sqrt2, 2/sqrt2]
    np.testing.assert_allclose(model.rotate(x), [[4 * h, 2 * h]], rtol=1e-6)
    np.testing.assert_allclose(model.encode(x), [[4 * h, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(model.decode(model.encode(x)), [[2.0, 2.0]], rtol=1e-6)


def test_rotation_setter_rejects_non_orthogonal_and_wrong_shape() -> None:
    model = IdentityBasis(d=2, n_latents=2, k=1)
    with pytest.raises(ValueError, match="orthogonal"):
        model.rotation = np.array([[1.0, 0.1], [0.0, 1.0]])
    with pytest.raises(ValueError, match=r"shape \(2, 2\)"):
        model.rotation = np.eye(3)
    with pytest.raises(ValueError, match=r"mean must have shape \(2,\)"):
        model.mean = np.zeros(3)


def test_fit_init_sets_mean(data: np.ndarray) -> None:
    model = fitted("identity", data, 2)
    np.testing.assert_allclose(model.mean, data.astype(np.float64).mean(0), atol=1e-6)


# --- properties of every baseline --------------------------------------------------------------
@pytest.mark.parametrize("method", BASELINES)
def test_baseline_is_orthogonal_and_invertible_at_k_equal_d(method: str, data: np.ndarray) -> None:
    model = fitted(method, data, 2)
    u = model.rotation
    np.testing.assert_allclose(u @ u.T, np.eye(8), atol=1e-5)
    x = torch.as_tensor(data[:50])
    assert torch.allclose(model(x, k=8), x, atol=1e-5)
    assert model.signed and not model.trainable and model.n_latents == 8


@pytest.mark.parametrize("method", BASELINES)
def test_baseline_codes_have_exactly_k_nonzeros_and_fvu_falls_with_k(method: str, data: np.ndarray) -> None:
    model = fitted(method, data, 2)
    x = torch.as_tensor(data)
    assert ((model.encode(x, k=3) != 0).sum(1) == 3).all()
    errors = [float(((model(x, k=k) - x) ** 2).sum()) for k in range(1, 9)]
    assert all(a > b for a, b in zip(errors, errors[1:]))


@pytest.mark.parametrize("method", BASELINES)
def test_baseline_save_load_round_trip(method: str, data: np.ndarray, tmp_path) -> None:
    model = fitted(method, data, 3)
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)
    assert type(loaded) is type(model)
    x = torch.as_tensor(data[:40])
    assert torch.equal(loaded.encode(x), model.encode(x))
    assert torch.equal(loaded(x), model(x))


@pytest.mark.parametrize("method", BASELINES)
def test_baseline_numpy_and_tensor_paths_agree(method: str, data: np.ndarray) -> None:
    model = fitted(method, data, 3)
    codes = model.encode(data[:30])
    assert isinstance(codes, np.ndarray) and codes.dtype == np.float32
    np.testing.assert_array_equal(codes, model.encode(torch.as_tensor(data[:30])).numpy())
    np.testing.assert_array_equal(model.decode(codes), model.decode(torch.as_tensor(codes)).numpy())


def test_latents_are_half_axes(data: np.ndarray) -> None:
    model = fitted("identity", data, 2)
    codes = torch.tensor([[1.5, -2.0, 0, 0, 0, 0, 0, 0]])
    half = model.latents(codes)
    assert half.shape == (1, 16)
    assert half[0, 0] == 1.5 and half[0, 8 + 1] == 2.0 and half.sum() == 3.5


# --- PCA -------------------------------------------------------------------------------------------
def test_pca_finds_the_axes_of_an_anisotropic_gaussian() -> None:
    rng = np.random.default_rng(0)
    q = ortho_group.rvs(4, random_state=rng)
    x = (rng.standard_normal((5000, 4)) * np.array([4.0, 2.0, 1.0, 0.5])) @ q + 3.0
    model = fitted("pca", x.astype(np.float32), 1)
    np.testing.assert_allclose(np.abs(model.rotation @ q.T), np.eye(4), atol=0.03)
    variances = model.rotate(x.astype(np.float32)).var(0)
    assert all(np.diff(variances) < 0)


def test_pca_and_ica_need_n_at_least_d() -> None:
    x = torch.randn(5, 8)
    for method in ("pca", "ica"):
        model = build(method, 8, 8, 2)
        with pytest.raises(ValueError, match=r"fit_init needs at least 8 rows \(d=8\), got 5"):
            model.fit_init(x)
        assert np.array_equal(model.mean, np.zeros(8))  # a rejected sample leaves the model untouched


# --- ICA -------------------------------------------------------------------------------------------
def test_ica_recovers_planted_sparse_axes_where_pca_cannot() -> None:
    p = planted(3000, 8, 2, noise=0.01, seed=1)  # uniform support: all axes equal variance
    assert axis_recovery(fitted("ica", p.x, 2).rotation, p.q) > 0.98
    assert axis_recovery(fitted("pca", p.x, 2).rotation, p.q) < 0.9


def test_ica_stays_orthogonal_on_anisotropic_and_rank_deficient_samples() -> None:
    rng = np.random.default_rng(2)
    x = (rng.laplace(size=(500, 6)) * np.array([5.0, 3.0, 2.0, 1.0, 0.5, 0.1])) @ ortho_group.rvs(6, random_state=rng)
    u = fitted("ica", x.astype(np.float32), 2).rotation
    np.testing.assert_allclose(u @ u.T, np.eye(6), atol=1e-5)
    low_rank = rng.laplace(size=(6, 3)) @ rng.standard_normal((3, 6))  # n = d = 6, rank 3 after centring at most
    u = fitted("ica", low_rank.astype(np.float32), 2).rotation
    np.testing.assert_allclose(u @ u.T, np.eye(6), atol=1e-5)


def test_ica_options_validated_and_round_trip() -> None:
    model = ICABasis(d=4, n_latents=4, k=1, fun="cube", max_iter=50, tol=1e-3)
    assert dataclasses.asdict(model.options) == {"fun": "cube", "max_iter": 50, "tol": 1e-3}
    with pytest.raises(ValueError, match=r"fun\n.*'logcosh', 'exp' or 'cube'"):
        ICABasis(d=4, n_latents=4, k=1, fun="tanh")  # type: ignore[arg-type]


# --- random rotation ----------------------------------------------------------------------------------
def test_random_rotation_depends_on_build_seed_only() -> None:
    a = build("random_rotation", 6, 6, 2, seed=1).rotation
    b = build("random_rotation", 6, 6, 2, seed=1).rotation
    c = build("random_rotation", 6, 6, 2, seed=2).rotation
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    np.testing.assert_allclose(a @ a.T, np.eye(6), atol=1e-6)


# --- errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [IdentityBasis, PCABasis, RandomRotation])
def test_clear_errors(cls) -> None:
    model = cls(d=4, n_latents=4, k=2)
    with pytest.raises(ValueError, match=r"k=5 must be in 1..d=4"):
        model.encode(torch.zeros(2, 4), k=5)
    with pytest.raises(ValueError, match=r"expected input of shape \(n, 4\)"):
        model.encode(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="NaN"):
        model.encode(torch.tensor([[0.0, float("nan"), 0.0, 0.0]]))
    with pytest.raises(ValueError, match=r"expected codes of shape \(n, 4\)"):
        model.decode(torch.zeros(2, 5))
    with pytest.raises(TypeError, match="k must be an int"):
        model.encode(torch.zeros(2, 4), k=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_latents = d"):
        cls(d=4, n_latents=8, k=2)
    with pytest.raises(ValueError, match="fit_init needs at least"):
        model.fit_init(torch.zeros(0, 4))
