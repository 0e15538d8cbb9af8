"""CEDAR (pipeline.models.cedar): forward by hand, orthogonality, schedule, training, I/O, errors."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from pipeline.data.planted import planted
from pipeline.metrics.reconstruction import fvu
from pipeline.metrics.recovery import axis_recovery
from pipeline.models.cedar import (
    Cedar,
    cayley_rotation,
    curriculum_k,
    expm_rotation,
    householder_rotation,
    random_k_bounds,
    sample_k,
)
from pipeline.models.checkpoint import load_model, save_model
from pipeline.models.registry import build
from pipeline.training.sparse import fit_cedar

PARAMETRIZATIONS = ["expm", "cayley", "householder"]
QUARTER_TURN = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])


def quarter_turn_model(parametrization: str, k: int = 2) -> Cedar:
    """d = 3 CEDAR whose U is the quarter turn about the third axis, with b = [0.5, 0, -1]."""
    model = Cedar(d=3, n_latents=3, k=k, parametrization=parametrization, random_k="none", curriculum_frac=0.0)
    # expm: exp(S) with S = (pi/2) J;  cayley: (I - S)^-1 (I + S) with S = tan(pi/4) J = J
    scale = {"expm": math.pi / 2, "cayley": 1.0}[parametrization]
    with torch.no_grad():
        model.A.zero_()
        model.A[0, 1] = -scale / 2
        model.A[1, 0] = scale / 2
    model.mean = np.array([0.5, 0.0, -1.0])
    return model


def train_steps(model: Cedar, x: np.ndarray, steps: int, lr: float = 0.05, batch: int = 128) -> Cedar:
    """The training loop's call order (pipeline.training.loop), in a few lines, for fast tests."""
    xt = torch.as_tensor(x)
    model.fit_init(xt)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for step in range(steps):
        xb = xt[(step * batch) % len(xt) :][:batch]
        loss, stats = model.training_loss(xb, step / steps, generator)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        model.before_step()
        optimizer.step()
        model.after_step()
    return model.eval()


@pytest.fixture(scope="module")
def planted_small():
    return planted(2000, 8, 2, noise=0.01, seed=0)


@pytest.fixture(scope="module")
def trained(planted_small) -> Cedar:
    torch.manual_seed(0)
    return train_steps(Cedar(d=8, n_latents=8, k=2, random_k="none"), planted_small.x, steps=300)


# --- hand-computed forward ----------------------------------------------------------------------
@pytest.mark.parametrize("parametrization", ["expm", "cayley"])
def test_forward_by_hand_quarter_turn(parametrization: str) -> None:
    model = quarter_turn_model(parametrization)
    np.testing.assert_allclose(model.rotation, QUARTER_TURN, atol=1e-6)
    x = np.array([[1.5, 2.0, 2.0], [-0.5, 0.0, -1.0]], dtype=np.float32)  # x - b = [1, 2, 3], [-1, 0, 0]
    np.testing.assert_allclose(model.rotate(x), [[-2.0, 1.0, 3.0], [0.0, -1.0, 0.0]], atol=1e-6)
    codes = model.encode(x)  # top-2 by |.|: 3 and -2 survive with their signs
    np.testing.assert_allclose(codes[0], [-2.0, 0.0, 3.0], atol=1e-6)
    np.testing.assert_allclose(codes[1], [0.0, -1.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(model.decode(codes), [[0.5, 2.0, 2.0], [-0.5, 0.0, -1.0]], atol=1e-6)
    np.testing.assert_allclose(model.encode(x, k=1)[0], [0.0, 0.0, 3.0], atol=1e-6)
    np.testing.assert_allclose(model(torch.as_tensor(x), k=1)[0].detach().numpy(), [0.5, 0.0, 2.0], atol=1e-6)


def test_l1_loss_by_hand() -> None:
    model = quarter_turn_model("expm", k=2)
    x = torch.tensor([[1.5, 2.0, 2.0], [-0.5, 0.0, -1.0]])
    # residuals: row 0 -> [1, 0, 0] (L1 = 1), row 1 -> exact (L1 = 0); mean = 0.5
    loss, stats = model.training_loss(x, 1.0, torch.Generator().manual_seed(0))
    assert loss.item() == pytest.approx(0.5, abs=1e-6)
    assert stats["l0"].item() == 2.0
    model_k1 = quarter_turn_model("expm", k=1)
    loss, _ = model_k1.training_loss(x, 1.0, torch.Generator())  # row 0 -> [1, 2, 0] (3), row 1 -> 0
    assert loss.item() == pytest.approx(1.5, abs=1e-6)


def test_householder_matches_lapack_product() -> None:
    a = 0.3 * torch.randn(6, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    v = torch.tril(a, -1) + torch.eye(6, dtype=torch.float64)
    lapack = -torch.linalg.householder_product(v, 2.0 / (v * v).sum(0))
    assert torch.allclose(householder_rotation(a), lapack, atol=1e-12)


@pytest.mark.parametrize("orth", [expm_rotation, cayley_rotation, householder_rotation])
def test_zero_parameter_gives_identity(orth) -> None:
    assert torch.allclose(orth(torch.zeros(5, 5)), torch.eye(5), atol=1e-7)


# --- orthogonality and invertibility -------------------------------------------------------------
@pytest.mark.parametrize("parametrization", PARAMETRIZATIONS)
def test_orthogonal_after_training(parametrization: str, planted_small) -> None:
    torch.manual_seed(0)
    model = train_steps(Cedar(d=8, n_latents=8, k=2, parametrization=parametrization, init="random", init_scale=1.4), planted_small.x, steps=120, lr=0.1)
    assert float(model.A.detach().abs().max()) > 0.5  # the rotation moved far from its start
    u = torch.as_tensor(model.rotation, dtype=torch.float64)
    assert torch.allclose(u @ u.T, torch.eye(8, dtype=torch.float64), atol=1e-5)


@pytest.mark.parametrize("parametrization", PARAMETRIZATIONS)
def test_exactly_invertible_at_k_equal_d(parametrization: str) -> None:
    torch.manual_seed(3)
    model = Cedar(d=16, n_latents=16, k=4, parametrization=parametrization, init="random", init_scale=1.2)
    x = torch.randn(64, 16) * 3 + 1
    model.fit_init(x)
    assert torch.allclose(model(x, k=16), x, atol=2e-5)


def test_gradient_reaches_A_below_full_k() -> None:
    torch.manual_seed(0)
    model = Cedar(d=6, n_latents=6, k=2, random_k="none", curriculum_frac=0.0)
    x = torch.randn(32, 6)
    model.fit_init(x)
    loss, _ = model.training_loss(x, 0.5, torch.Generator())
    loss.backward()
    assert float(model.A.grad.abs().sum()) > 0


# --- schedule ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ("linear", [64, 49, 34, 4, 4]),  # 64 + (4 - 64) t
        ("cosine", [64, 55, 34, 4, 4]),  # 4 + 60 (1 + cos(pi t)) / 2: t = 1/4 -> 55.2
        ("exponential", [64, 32, 16, 4, 4]),  # 64 (4 / 64)^t
    ],
)
def test_curriculum_values(shape: str, expected: list[int]) -> None:
    progress = [0.0, 0.125, 0.25, 0.5, 0.9]  # t = progress / 0.5, capped at 1
    assert [curriculum_k(p, 4, 64, 0.5, shape) for p in progress] == expected


def test_curriculum_model_defaults_and_disabled() -> None:
    model = Cedar(d=32, n_latents=32, k=2)
    assert model.curriculum_k(0.0) == 32 and model.curriculum_k(0.5) == 2 and model.curriculum_k(1.0) == 2
    assert Cedar(d=32, n_latents=32, k=2, k_start=8, curriculum_shape="linear").curriculum_k(0.25) == 5
    assert Cedar(d=32, n_latents=32, k=2, curriculum_frac=0.0).curriculum_k(0.0) == 2


def test_random_k_bounds_fraction_and_absolute() -> None:
    assert random_k_bounds(40, 0.5) == (20, 40)
    assert random_k_bounds(40, 0.01) == (1, 40)
    assert random_k_bounds(40, 8) == (8, 40)
    assert random_k_bounds(5, 8) == (5, 5)


@pytest.mark.parametrize("mode", ["uniform", "loguniform"])
def test_random_k_within_bounds_and_covers_them(mode: str) -> None:
    generator = torch.Generator().manual_seed(0)
    ks = np.array([sample_k(16, mode, 0.25, generator) for _ in range(2000)])
    assert ks.min() == 4 and ks.max() == 16
    counts = np.bincount(ks, minlength=17)[4:]
    if mode == "uniform":
        assert counts.min() > 80  # 13 values, about 154 each
    else:
        assert counts[0] > counts[-1] * 2  # log-uniform: k = 4 much likelier than k = 16


def test_random_k_none_and_training_stats() -> None:
    assert sample_k(9, "none", 0.5, torch.Generator()) == 9
    model = Cedar(d=8, n_latents=8, k=2, random_k="uniform", random_k_min=0.5)
    x = torch.randn(16, 8)
    model.fit_init(x)
    generator = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(50):
        loss, stats = model.training_loss(x, 0.0, generator)  # curriculum at its start: k_current = 8
        assert stats["k_curriculum"].item() == 8
        seen.add(int(stats["l0"].item()))
    assert seen == {4, 5, 6, 7, 8}


def test_dense_start_reconstructs_exactly() -> None:
    model = Cedar(d=8, n_latents=8, k=2, random_k="none")
    x = torch.randn(16, 8)
    model.fit_init(x)
    loss, stats = model.training_loss(x, 0.0, torch.Generator())
    assert stats["l0"].item() == 8 and loss.item() < 1e-5


# --- trained behaviour -----------------------------------------------------------------------------
def test_trained_model_recovers_planted_axes_and_fvu_falls_with_k(trained: Cedar, planted_small) -> None:
    assert axis_recovery(trained.rotation, planted_small.q) > 0.95
    x = planted_small.x
    fvus = [fvu(x, trained.decode(trained.encode(x, k=k))) for k in range(1, 9)]
    assert all(a > b for a, b in zip(fvus, fvus[1:]))
    assert fvus[-1] < 1e-10


def test_save_load_round_trip_identical_outputs(trained: Cedar, tmp_path) -> None:
    model = build("cedar", 8, 8, 2, seed=0, parametrization="cayley", curriculum_shape="cosine", random_k="loguniform", random_k_min=2.0)
    model.load_state_dict(trained.state_dict())
    model.mean = trained.mean + 1.0
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)
    assert isinstance(loaded, Cedar) and loaded.options == model.options
    x = torch.randn(20, 8)
    assert torch.equal(loaded.encode(x), model.eval().encode(x))
    assert torch.equal(loaded(x, k=3), model(x, k=3))


def test_numpy_and_tensor_paths_agree(trained: Cedar, planted_small) -> None:
    x = planted_small.x[:50]
    codes = trained.encode(x, k=3)
    assert isinstance(codes, np.ndarray) and codes.shape == (50, 8)
    with torch.no_grad():
        np.testing.assert_array_equal(codes, trained.encode(torch.as_tensor(x), k=3).numpy())
        np.testing.assert_array_equal(trained.decode(codes), trained.decode(torch.as_tensor(codes)).numpy())
    assert isinstance(trained.rotation, np.ndarray) and trained.rotation.shape == (8, 8)
    assert isinstance(trained.mean, np.ndarray) and trained.mean.shape == (8,)


def test_inference_cache_follows_changes_to_A() -> None:
    model = Cedar(d=4, n_latents=4, k=2).eval()
    first = model.rotation
    with torch.no_grad():
        model.A[0, 1] = 0.3
    assert not np.allclose(model.rotation, first)
    state = {"A": torch.zeros(4, 4), "b": torch.zeros(4), "base": torch.eye(4)}
    model.load_state_dict(state)
    np.testing.assert_allclose(model.rotation, np.eye(4), atol=1e-7)


def test_fit_convenience_recovers_planted_axes() -> None:
    p = planted(3000, 16, 3, noise=0.01, seed=1)
    model = fit_cedar(p.x, 3, seed=0, epochs=6, min_steps=0, lr=1e-2, batch_size=128, parametrization="householder")
    assert isinstance(model, Cedar) and model.options.parametrization == "householder" and not model.training
    assert axis_recovery(model.rotation, p.q) > 0.95
    with pytest.raises(ValueError, match="unknown options"):
        fit_cedar(p.x, 3, epoch=2)


# --- options and errors ----------------------------------------------------------------------------
def test_options_rebuild_and_are_validated_by_the_options_class() -> None:
    model = build("cedar", 6, 6, 2, seed=0, init="random", k_start=4)
    options = dataclasses.asdict(model.options)
    assert build("cedar", 6, 6, 2, seed=0, **options).options == model.options
    assert torch.equal(build("cedar", 6, 6, 2, seed=0, init="random").A, build("cedar", 6, 6, 2, seed=0, init="random").A)
    assert Cedar.Options(parametrization="cayley", random_k_min=4).random_k_min == 4.0
    with pytest.raises(ValueError, match="parametrization"):
        Cedar.Options(parametrization="qr")
    with pytest.raises(ValueError, match="unknown"):
        Cedar.Options(unknown=1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"parametrization": "qr"}, "parametrization"),
        ({"k_start": 2}, r"k_start must be 0 \(= d\) or in k..d"),
        ({"k_start": 9}, r"k_start must be 0 \(= d\) or in k..d"),
        ({"curriculum_frac": 1.5}, "curriculum_frac"),
        ({"random_k_min": 0.0}, "random_k_min"),
        ({"init_scale": -1.0}, "init_scale"),
    ],
)
def test_bad_options_raise(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Cedar(d=8, n_latents=8, k=3, **options)


def test_clear_input_errors() -> None:
    model = Cedar(d=4, n_latents=4, k=2)
    with pytest.raises(ValueError, match=r"k=5 must be in 1..d=4"):
        model.encode(torch.zeros(2, 4), k=5)
    with pytest.raises(ValueError, match=r"expected input of shape \(n, 4\), got \(2, 3\)"):
        model.encode(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="NaN"):
        model(torch.tensor([[0.0, float("nan"), 0.0, 0.0]]))
    with pytest.raises(ValueError, match="NaN"):
        model.training_loss(torch.full((2, 4), float("nan")), 0.0, torch.Generator())
    with pytest.raises(ValueError, match="n_latents = d"):
        Cedar(d=4, n_latents=8, k=2)
    with pytest.raises(ValueError, match="k <= n_latents"):
        Cedar(d=4, n_latents=4, k=5)
    with pytest.raises(AttributeError):
        model.rotation = np.eye(4)  # CEDAR's rotation is learned from A


def test_pca_init_starts_at_the_pca_baseline_and_l2_loss_is_the_squared_error() -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((500, 6)) * np.array([3.0, 2.0, 1.5, 1.0, 0.5, 0.2])).astype(np.float32)
    cedar = build("cedar", 6, 6, 2, seed=0, init="pca", random_k="none", curriculum_frac=0.0)
    pca = build("pca", 6, 6, 2, seed=0)
    for model in (cedar, pca):
        model.fit_init(torch.as_tensor(x))
    np.testing.assert_allclose(cedar.rotation, pca.rotation, atol=1e-6)
    np.testing.assert_allclose(cedar.encode(x), pca.encode(x), atol=1e-5)
    with torch.no_grad():
        cedar.A.add_(0.1 * torch.randn(6, 6))  # a learned rotation on top of B stays exactly orthogonal
    u = cedar.rotation
    np.testing.assert_allclose(u @ u.T, np.eye(6), atol=1e-5)
    l2 = build("cedar", 6, 6, 2, seed=0, loss="l2", random_k="none", curriculum_frac=0.0)
    l2.fit_init(torch.as_tensor(x))
    batch = torch.as_tensor(x[:32])
    loss, stats = l2.training_loss(batch, 1.0, torch.Generator())
    expected = ((batch - l2(batch, 2)) ** 2).sum(1).mean()
    torch.testing.assert_close(loss, expected)
    assert set(stats) >= {"l2", "l0"}
    few = build("cedar", 6, 6, 2, init="pca")
    few.fit_init(torch.as_tensor(x[:3]))  # 3 rows < d: their 2 principal axes, then an orthonormal completion
    np.testing.assert_allclose(few.rotation @ few.rotation.T, np.eye(6), atol=1e-5)
    centred = x[:3] - x[:3].mean(0)
    np.testing.assert_allclose(np.linalg.norm(centred @ few.rotation[:2].T), np.linalg.norm(centred), rtol=1e-5)
