"""SAE zoo (pipeline.models.sae, .topk, .penalty): hand-computed sparsifiers, straight-through gradients, AuxK,
BatchTopK's threshold buffer, the L0 controller of ReLU / JumpReLU, decoder geometry, errors,
checkpoints, and training on planted data."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from pipeline.models.checkpoint import load_model, save_model
from pipeline.models.penalty import JumpReLUFunction, JumpReLUSAE, ReLUSAE, StepFunction, l0_control_step, rectangle
from pipeline.models.registry import build, model_class
from pipeline.models.sae import (
    SAE,
    batch_topk_codes,
    geometric_median,
    replacements,
    residual_directions,
    sparse_directions,
    topk_codes,
    unshared_fraction,
    untangled,
)
from pipeline.models.topk import BatchTopKSAE, MatryoshkaSAE, PrefixMatryoshkaSAE, TopKSAE
from pipeline.training.sparse import fit_sae as fit

SAE_METHODS = ["relu", "topk", "batchtopk", "jumprelu", "matryoshka", "matryoshka_prefix"]
GEN = torch.Generator().manual_seed(0)


def identity_model(method: str, k: int = 2, **options: object) -> SAE:
    """d = n_latents = 4, W_enc = W_dec = I, zero biases, input_scale 1: pre-activations = x."""
    model = build(method, d=4, dict_size=4, k=k, seed=0, **options)
    with torch.no_grad():
        model.W_enc.copy_(torch.eye(4))
        model.W_dec.copy_(torch.eye(4))
        model.b_enc.zero_()
        model.b_dec.zero_()
        model.input_scale.fill_(1.0)
    return model


def planted_sparse(n: int = 2048, d: int = 16, m: int = 64, k: int = 4, seed: int = 0) -> np.ndarray:
    """x = s D: D (m, d) random unit rows, s (n, m) with k non-zeros per row, values in [0.5, 1.5]."""
    rng = np.random.default_rng(seed)
    atoms = rng.standard_normal((m, d))
    atoms /= np.linalg.norm(atoms, axis=1, keepdims=True)
    codes = np.zeros((n, m))
    support = np.argsort(rng.random((n, m)), axis=1)[:, :k]
    np.put_along_axis(codes, support, rng.uniform(0.5, 1.5, (n, k)), axis=1)
    return (codes @ atoms).astype(np.float32)


def fvu(model: SAE, x: np.ndarray) -> float:
    recon = model.decode(model.encode(x))
    return float(((recon - x) ** 2).sum() / ((x - x.mean(0)) ** 2).sum())


# --- sparsifier helpers ------------------------------------------------------------------------
def test_topk_codes_keeps_the_k_largest_per_row() -> None:
    acts = torch.tensor([[0.1, 3.0, 2.0, 0.5], [4.0, 0.0, 1.0, 2.0]])
    expected = torch.tensor([[0.0, 3.0, 2.0, 0.0], [4.0, 0.0, 0.0, 2.0]])
    assert torch.equal(topk_codes(acts, 2), expected)


def test_batch_topk_keeps_k_times_batch_over_the_whole_batch() -> None:
    # k = 2, n = 2: the 4 largest of the batch (3, 2.5, 2, 1.5) survive, rows get 3 and 1.
    acts = torch.tensor([[3.0, 2.5, 2.0, 0.1], [1.5, 0.0, 1.0, 0.2]])
    codes, smallest = batch_topk_codes(acts, 2)
    assert torch.equal(codes, torch.tensor([[3.0, 2.5, 2.0, 0.0], [1.5, 0.0, 0.0, 0.0]]))
    assert float(smallest) == 1.5


def test_batch_topk_smallest_ignores_kept_zeros_and_is_nan_when_nothing_positive() -> None:
    acts = torch.tensor([[2.0, 0.0, 0.0, 0.0]])  # k * n = 3 but one positive value
    codes, smallest = batch_topk_codes(acts, 3)
    assert torch.equal(codes, acts) and float(smallest) == 2.0
    _, none = batch_topk_codes(torch.zeros(2, 4), 1)
    assert math.isnan(float(none))


def test_rectangle_kernel_is_one_strictly_inside_half_width() -> None:
    u = torch.tensor([-0.6, -0.5, -0.49, 0.0, 0.49, 0.5, 0.6])
    assert torch.equal(rectangle(u), torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0]))


def test_geometric_median_of_a_convex_quadrilateral_is_where_its_diagonals_cross() -> None:
    # Diagonals (0,0)-(3,3) [y = x] and (4,0)-(0,1) [y = 1 - x/4] cross at (0.8, 0.8); the mean is (1.75, 1).
    x = torch.tensor([[0.0, 0.0], [4.0, 0.0], [3.0, 3.0], [0.0, 1.0]], dtype=torch.float64)
    assert torch.allclose(geometric_median(x, iters=2000, tol=1e-12), torch.tensor([0.8, 0.8], dtype=torch.float64), atol=1e-4)


# --- JumpReLU straight-through estimators, by hand ---------------------------------------------------
def test_jumprelu_function_forward_and_pseudo_gradients_by_hand() -> None:
    # theta = (1, 2), eps = 0.1: window |z - theta| < 0.05.
    z = torch.tensor([[1.02, 2.5], [0.97, 1.96], [0.5, 2.04]], requires_grad=True)
    theta = torch.tensor([1.0, 2.0], requires_grad=True)
    y = JumpReLUFunction.apply(z, theta, 0.1)
    assert torch.allclose(y, torch.tensor([[1.02, 2.5], [0.0, 0.0], [0.0, 2.04]]))
    grad_out = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    y.backward(grad_out)
    # dy/dz = H(z - theta) times the incoming gradient.
    assert torch.equal(z.grad, torch.tensor([[1.0, 2.0], [0.0, 0.0], [0.0, 6.0]]))
    # dy/dtheta = -(theta / eps) * K((z - theta) / eps) * g, summed over rows:
    # latent 0: rows 0 (1.02) and 1 (0.97) are in the window: -(1 / 0.1) * (1 + 3) = -40
    # latent 1: rows 1 (1.96) and 2 (2.04): -(2 / 0.1) * (4 + 6) = -200
    assert torch.allclose(theta.grad, torch.tensor([-40.0, -200.0]))


def test_step_function_pseudo_gradients_by_hand() -> None:
    z = torch.tensor([[1.02, 2.5], [0.97, 1.96]], requires_grad=True)
    theta = torch.tensor([1.0, 2.0], requires_grad=True)
    h = StepFunction.apply(z, theta, 0.1)
    assert torch.equal(h, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    h.sum().backward()
    assert torch.equal(z.grad, torch.zeros(2, 2))  # no gradient to the pre-activations
    # -(1 / eps) * (number of rows in the window): latent 0 has 2, latent 1 has 1 (1.96).
    assert torch.allclose(theta.grad, torch.tensor([-20.0, -10.0]))


def test_jumprelu_model_loss_and_log_threshold_gradient_by_hand() -> None:
    model = identity_model("jumprelu", k=1, l0_coef=0.5, bandwidth=0.05)  # kernel width 0.05 * sqrt(4) = 0.1
    with torch.no_grad():
        model.log_threshold.copy_(torch.log(torch.tensor([1.0, 1.0, 1.0, 1.0])))
    x = torch.tensor([[1.02, 0.5, 0.0, 0.0]])
    loss, stats = model.training_loss(x, 0.0, GEN)
    # codes (1.02, 0, 0, 0) reconstruct x except the 0.5: mse = 0.25 / 4; L0 = 1.
    assert stats["l0"] == 1.0
    assert math.isclose(float(stats["mse"]), 0.0625, rel_tol=1e-6)
    assert math.isclose(float(stats["l0_penalty"]), 0.5, rel_tol=1e-6)
    loss.backward()
    # latent 0 is in the window (|1.02 - 1| < 0.05). d mse / d y0 = 2 (y0 - x0) / 4 = 0, so only the
    # L0 term acts: d/dtheta0 = 0.5 * -(1 / 0.1) = -5; d/dlog theta0 = theta0 * (-5) = -5.
    assert torch.allclose(model.log_threshold.grad, torch.tensor([-5.0, 0.0, 0.0, 0.0]))


# --- hand-computed forward passes ---------------------------------------------------------------------
def test_topk_encode_keeps_k_largest_after_relu_and_k_overrides() -> None:
    model = identity_model("topk", k=2)
    x = torch.tensor([[3.0, -5.0, 1.0, 2.0], [-1.0, -2.0, 0.5, -3.0]])
    assert torch.equal(model.encode(x), torch.tensor([[3.0, 0.0, 0.0, 2.0], [0.0, 0.0, 0.5, 0.0]]))
    assert torch.equal(model.encode(x, k=1), torch.tensor([[3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.5, 0.0]]))


def test_encode_subtracts_b_dec_and_decode_folds_the_scale_back() -> None:
    model = identity_model("topk", k=4)
    with torch.no_grad():
        model.b_dec.copy_(torch.tensor([1.0, 1.0, 1.0, 1.0]))
        model.b_enc.copy_(torch.tensor([0.0, 0.5, 0.0, 0.0]))
        model.input_scale.fill_(2.0)
    x = torch.tensor([[1.0, 2.0, 0.0, 3.0]])
    codes = model.encode(x)  # (2x - 1) + b_enc, then ReLU
    assert torch.equal(codes, torch.tensor([[1.0, 3.5, 0.0, 5.0]]))
    # decode = (codes W_dec + b_dec) / scale
    assert torch.allclose(model.decode(codes), torch.tensor([[1.0, 2.25, 0.5, 3.0]]))


def test_sparse_decode_by_hand_folds_bias_and_scale_back() -> None:
    model = identity_model("topk", k=1)
    with torch.no_grad():
        model.b_dec.copy_(torch.tensor([1.0, 1.0, 1.0, 1.0]))
        model.input_scale.fill_(2.0)
    codes = torch.tensor([[0.0, 3.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # 1 in 12: sparse
    expected = torch.tensor([[0.5, 2.0, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5]])
    assert torch.allclose(model.decode_sparse(codes), expected)


@pytest.mark.parametrize("method", SAE_METHODS)
def test_sparse_decode_equals_the_dense_decode(method: str) -> None:
    """The sparse product (k of 256 latents per row) and the dense fallback (codes with every latent active) give
    `decode`'s reconstruction."""
    model = build(method, 16, 256, 4, seed=0)
    x = torch.randn(300, 16, generator=torch.Generator().manual_seed(0))
    model.fit_init(x)
    with torch.no_grad():
        sparse = model.encode(x[:64])
        dense = torch.rand(8, 256, generator=torch.Generator().manual_seed(1))
        assert 0 < int(sparse.count_nonzero()) * 8 < sparse.numel()
        for codes in (sparse, dense):
            assert torch.allclose(model.decode_sparse(codes), model.decode(codes), atol=1e-5)


def test_relu_codes_and_decoder_norm_weighted_l1() -> None:
    model = identity_model("relu", l1_coef=0.1)
    with torch.no_grad():
        model.W_dec.copy_(torch.diag(torch.tensor([2.0, 1.0, 1.0, 3.0])))  # norms 2, 1, 1, 3
    x = torch.tensor([[1.0, -1.0, 0.5, 2.0], [0.0, 2.0, -1.0, 0.0]])
    assert torch.equal(model.encode(x, k=1), torch.tensor([[1.0, 0.0, 0.5, 2.0], [0.0, 2.0, 0.0, 0.0]]))  # k ignored
    _, stats = model.training_loss(x, 0.0, GEN)
    # sum_i f_i ||d_i||: row 0 = 1*2 + 0.5*1 + 2*3 = 8.5, row 1 = 2*1 = 2 -> mean 5.25 -> * 0.1
    assert math.isclose(float(stats["l1"]), 0.525, rel_tol=1e-6)
    assert float(stats["l0"]) == 2.0


def test_batchtopk_training_codes_ema_update_and_threshold_inference() -> None:
    model = identity_model("batchtopk", k=1, threshold_decay=0.9, aux_coef=0.0)
    model.threshold.fill_(0.5)
    x = torch.tensor([[3.0, 2.0, 0.0, 0.0], [0.1, 0.0, 1.0, 0.0]])
    _, stats = model.training_loss(x, 0.0, GEN)
    # k * n = 2 kept over the batch: 3 and 2, both in row 0 -> l0 = 1; smallest kept = 2.
    assert float(stats["l0"]) == 1.0
    assert math.isclose(float(model.threshold), 0.9 * 0.5 + 0.1 * 2.0, rel_tol=1e-6)  # 0.65
    # Inference: the fixed threshold 0.65, row by row (no batch coupling).
    assert torch.equal(model.encode(x), torch.tensor([[3.0, 2.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]))
    # A k other than the model's: per-row top-k.
    assert torch.equal(model.encode(x, k=2), torch.tensor([[3.0, 2.0, 0.0, 0.0], [0.1, 0.0, 1.0, 0.0]]))


def test_batchtopk_threshold_survives_save_and_load(tmp_path) -> None:
    model = build("batchtopk", d=8, dict_size=16, k=3, seed=1)
    model.fit_init(torch.randn(64, 8))
    model.threshold.fill_(0.123)
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)
    assert isinstance(loaded, BatchTopKSAE) and float(loaded.threshold) == pytest.approx(0.123)
    x = torch.randn(10, 8)
    assert torch.equal(loaded.encode(x), model.eval().encode(x))


@pytest.mark.parametrize("method", SAE_METHODS)
def test_every_method_round_trips_through_a_checkpoint(method: str, tmp_path) -> None:
    model = build(method, d=8, dict_size=16, k=4, seed=2)
    model.fit_init(torch.randn(128, 8) * 3 + 1)
    model.steps_since_active[:3] = 7
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)
    assert type(loaded) is type(model) and loaded.options == model.options
    assert torch.equal(loaded.steps_since_active, model.steps_since_active)
    x = torch.randn(20, 8) * 3 + 1
    assert torch.equal(loaded.decode(loaded.encode(x)), model.eval().decode(model.encode(x)))


def test_matryoshka_levels_and_nested_loss_by_hand() -> None:
    assert MatryoshkaSAE(4, 16, 8).k_levels == (2, 4, 8)
    assert MatryoshkaSAE(4, 16, 2).k_levels == (1, 2)
    assert MatryoshkaSAE(4, 16, 8, k_levels=(1, 3)).k_levels == (1, 3, 8)
    model = identity_model("matryoshka", k=2, k_levels=(1,), level_weights=(3.0, 1.0), aux_coef=0.0)
    assert model.level_weights == (0.75, 0.25)
    x = torch.tensor([[3.0, 0.0, 2.0, 0.0]])
    _, stats = model.training_loss(x, 0.0, GEN)
    # level k=1 keeps 3: error (0, 0, 2, 0) -> mse 4 / 4 = 1; level k=2 is exact -> 0.
    assert math.isclose(float(stats["mse"]), 0.75 * 1.0 + 0.25 * 0.0, rel_tol=1e-6)
    assert float(stats["l0"]) == 2.0


def test_prefix_matryoshka_prefixes_and_nested_loss_by_hand() -> None:
    assert PrefixMatryoshkaSAE(4, 64, 4).prefix_sizes == (8, 16, 32, 64)
    model = identity_model("matryoshka_prefix", k=2, prefix_fractions=(0.5,), aux_coef=0.0)
    assert model.prefix_sizes == (2, 4) and model.prefix_weights == (0.5, 0.5)
    x = torch.tensor([[1.0, 0.0, 0.0, 3.0], [0.0, 2.0, 4.0, 0.0]])
    _, stats = model.training_loss(x, 0.0, GEN)
    # batch top-4 keeps every non-zero. Prefix {0, 1} misses 3 and 4: sq. error 9 + 16 over 8 entries;
    # the full dictionary is exact.
    assert math.isclose(float(stats["mse"]), 0.5 * 25 / 8, rel_tol=1e-6)


# --- AuxK and dead latents -----------------------------------------------------------------------------
def test_auxk_gradient_reaches_only_dead_latents() -> None:
    torch.manual_seed(0)
    x = torch.randn(32, 8)
    models = []
    for aux_coef in (1.0, 0.0):
        model = build("topk", d=8, dict_size=16, k=2, seed=3, aux_coef=aux_coef, dead_steps=5, k_aux=512)
        model.fit_init(x)
        model.steps_since_active[[1, 6, 11]] = 5  # dead
        loss, stats = model.training_loss(x, 0.0, GEN)
        loss.backward()
        models.append((model, stats))
    (with_aux, stats), (without, _) = models
    assert float(stats["aux"]) > 0
    dead = torch.zeros(16, dtype=torch.bool)
    dead[[1, 6, 11]] = True
    for name in ("W_enc", "b_enc", "W_dec"):
        diff = (getattr(with_aux, name).grad - getattr(without, name).grad).abs()
        per_latent = diff.sum(1) if diff.ndim == 2 else diff
        assert float(per_latent[~dead].max()) == 0.0, name
        assert float(per_latent[dead].min()) > 0.0, name


def test_auxk_is_zero_without_dead_latents_and_caps_k_aux() -> None:
    model = identity_model("topk", k=1, k_aux=512, dead_steps=3)
    pre = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    torch.set_grad_enabled(False)  # the decoder is a parameter; values only here
    assert float(model.auxk_loss(pre, torch.ones(1, 4))) == 0.0
    model.steps_since_active[[0, 2]] = 3
    # 2 dead latents (k_aux capped to 2): codes (1, 0, 3, 0) reconstruct residual (1, 0, 3, 0) exactly.
    assert float(model.auxk_loss(pre, torch.tensor([[1.0, 0.0, 3.0, 0.0]]))) == 0.0
    # residual (0, 0, 3, 0): error (1, 0, 0, 0), normalised by mean(residual^2) = 9/4 -> (1/4) / (9/4)
    assert math.isclose(float(model.auxk_loss(pre, torch.tensor([[0.0, 0.0, 3.0, 0.0]]))), 1 / 9, rel_tol=1e-6)
    torch.set_grad_enabled(True)


def test_dead_counter_counts_steps_since_active() -> None:
    model = identity_model("topk", k=1, dead_steps=2, aux_coef=0.0)
    x = torch.tensor([[5.0, 1.0, 0.0, 0.0]])  # only latent 0 fires
    for _ in range(2):
        _, stats = model.training_loss(x, 0.0, GEN)
    assert model.steps_since_active.tolist() == [0, 2, 2, 2]
    assert float(stats["dead_fraction"]) == 0.75
    model.training_loss(torch.tensor([[0.0, 1.0, 0.0, 0.0]]), 0.0, GEN)
    assert model.steps_since_active.tolist() == [1, 0, 3, 3]


# --- decoder geometry and initialisation ---------------------------------------------------------------
@pytest.mark.parametrize("method", SAE_METHODS)
def test_encoder_starts_as_a_copy_of_the_decoder_and_atoms_have_unit_norm(method: str) -> None:
    model = build(method, d=6, dict_size=10, k=3, seed=0)
    assert torch.equal(model.W_enc, model.W_dec)
    assert model.W_enc.data_ptr() != model.W_dec.data_ptr()
    with torch.no_grad():
        model.W_enc.add_(1.0)
    assert not torch.equal(model.W_enc, model.W_dec)
    assert torch.allclose(model.W_dec.norm(dim=1), torch.ones(10), atol=1e-6)


@pytest.mark.parametrize("method", SAE_METHODS)
def test_decoder_rows_stay_unit_norm_and_gradient_is_projected(method: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 6) * 2 + 3
    model = build(method, d=6, dict_size=12, k=3, seed=0)
    model.fit_init(x)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(5):
        loss, _ = model.training_loss(x, 0.0, GEN)
        optimizer.zero_grad()
        loss.backward()
        model.before_step()
        radial = (model.W_dec.grad * model.W_dec.detach()).sum(1)
        assert float(radial.abs().max()) < 1e-6  # no component along the atoms
        optimizer.step()
        model.after_step()
        assert torch.allclose(model.W_dec.norm(dim=1), torch.ones(12), atol=1e-6)


def test_fit_init_sets_scale_bias_and_reconstructs_in_the_original_space() -> None:
    torch.manual_seed(0)
    x = torch.randn(500, 8) * 5 + 10
    model = build("topk", d=8, dict_size=8, k=8, seed=0)
    model.fit_init(x)
    centred_norm = (x - x.mean(0)).norm(dim=1).mean()
    assert float(model.input_scale) == pytest.approx(math.sqrt(8) / float(centred_norm), rel=1e-5)
    assert torch.allclose(model.b_dec, x.mean(0) * model.input_scale, atol=1e-4)
    # codes of zero decode to the data mean in the original space
    assert torch.allclose(model.decode(torch.zeros(1, 8)), x.mean(0, keepdim=True), atol=1e-4)
    assert BatchTopKSAE(8, 8, 2, bias_init="geometric_median").options.bias_init == "geometric_median"


def test_untrained_twins_are_sane_sparsifiers() -> None:
    torch.manual_seed(0)
    x = torch.randn(1000, 16)
    for method in ("relu", "topk", "batchtopk", "jumprelu", "matryoshka", "matryoshka_prefix"):
        model = build(method, d=16, dict_size=64, k=4, seed=0)
        model.fit_init(x)
        l0 = float((model.encode(x) != 0).float().sum(1).mean())
        assert abs(l0 - 4) < 0.1, (method, l0)
    jump = build("jumprelu", d=16, dict_size=64, k=4, seed=0)
    jump.fit_init(x)
    frequency = (jump.encode(x) != 0).float().mean(0)  # each latent fires on ~k/m of the rows
    assert float(frequency.min()) > 0.05 and float(frequency.max()) < 0.07
    # The fixed-coefficient ReLU keeps a zero encoder bias: about half its latents fire.
    relu = build("relu", d=16, dict_size=64, k=4, seed=0, target_l0=False)
    relu.fit_init(x)
    assert torch.equal(relu.b_enc, torch.zeros(64)) and 24 < float((relu.encode(x) != 0).float().sum(1).mean()) < 40


def test_array_io_and_same_seed_same_weights() -> None:
    a, b = build("topk", 4, 8, 2, seed=5), build("topk", 4, 8, 2, seed=5)
    assert torch.equal(a.W_dec, b.W_dec)
    codes = a.encode(np.ones((3, 4), dtype=np.float64))
    assert isinstance(codes, np.ndarray) and codes.shape == (3, 8) and codes.dtype == np.float32
    assert isinstance(a.decode(codes), np.ndarray)


# --- errors and options --------------------------------------------------------------------------------
def test_bad_inputs_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="1 <= k <= n_latents"):
        TopKSAE(4, 8, 9)
    model = build("batchtopk", 4, 8, 2, seed=0)
    with pytest.raises(ValueError, match=r"k=9 must be in 1..n_latents=8"):
        model.encode(torch.zeros(2, 4), k=9)
    with pytest.raises(TypeError, match="k must be an int"):
        model.encode(torch.zeros(2, 4), k=2.5)
    with pytest.raises(ValueError, match=r"expected input of shape \(n, 4\), got \(2, 5\)"):
        model.encode(torch.zeros(2, 5))
    with pytest.raises(ValueError, match="NaN"):
        model.encode(torch.full((1, 4), float("nan")))
    with pytest.raises(ValueError, match=r"expected codes of shape \(n, 8\)"):
        model.decode(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="empty sample"):
        model.fit_init(torch.zeros(0, 4))
    with pytest.raises(ValueError, match=r"training_loss|expected input of shape"):
        model.training_loss(torch.zeros(3, 2), 0.0, GEN)


@pytest.mark.parametrize(
    "cls, options, message",
    [
        (ReLUSAE, {"l1_coef": -1.0}, r"l1_coef\n.*greater than or equal to 0"),
        (ReLUSAE, {"l1_coef": float("inf")}, r"l1_coef\n.*finite number"),
        (ReLUSAE, {"l1_coef": 0.0}, "l1_coef must be > 0 with target_l0"),
        (ReLUSAE, {"l0_control_rate": 0.0}, r"l0_control_rate\n.*greater than 0"),
        (JumpReLUSAE, {"l0_coef": 0.0}, "l0_coef must be > 0 with target_l0"),
        (JumpReLUSAE, {"target_l0": "yes"}, r"target_l0\n.*valid boolean"),
        (TopKSAE, {"k_aux": 0}, r"k_aux\n.*greater than or equal to 1"),
        (TopKSAE, {"k_aux": True}, r"k_aux\n.*valid integer"),
        (TopKSAE, {"bias_init": "median"}, r"bias_init\n.*'mean' or 'geometric_median'"),
        (TopKSAE, {"dead_steps": 0}, r"dead_steps\n.*greater than or equal to 1"),
        (BatchTopKSAE, {"threshold_decay": 1.0}, r"threshold_decay\n.*less than 1"),
        (JumpReLUSAE, {"bandwidth": 0.0}, r"bandwidth\n.*greater than 0"),
        (MatryoshkaSAE, {"k_levels": (2, 9)}, "every k_levels value must be in 1..k=4"),
        (MatryoshkaSAE, {"level_weights": (1.0, 2.0)}, "level_weights must be 3 finite non-negative numbers"),
        (PrefixMatryoshkaSAE, {"prefix_fractions": (0.0, 0.5)}, r"prefix_fractions.0\n.*greater than 0"),
        (PrefixMatryoshkaSAE, {"prefix_fractions": ()}, "prefix_fractions must be non-empty"),
    ],
)
def test_bad_options_raise(cls: type[SAE], options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cls(4, 8, 4, **options)


@pytest.mark.parametrize("method", SAE_METHODS)
def test_options_class_lists_every_option_and_inherits_the_shared_ones(method: str) -> None:
    options = model_class(method).Options
    defaults = dataclasses.asdict(options())
    assert {"bias_init", "dead_steps"} <= set(defaults)  # SAE.Options, inherited
    model = build(method, 4, 16, 4, seed=0, **defaults)
    assert dataclasses.asdict(model.options) == defaults
    with pytest.raises(ValidationError):
        options(no_such_option=1)


def test_tuple_options_accept_lists_as_from_yaml() -> None:
    model = build("matryoshka", 4, 16, 8, seed=0, k_levels=[2, 4], level_weights=[1, 1, 2])
    assert model.k_levels == (2, 4, 8) and model.level_weights == (0.25, 0.25, 0.5)
    assert model.options.level_weights == (1.0, 1.0, 2.0)


# --- the L0 controller of ReLU and JumpReLU (k = target mean L0) -------------------------------------------
def test_l0_control_step_by_hand() -> None:
    coef = torch.tensor(0.1)
    # L0 above k raises the coefficient: 0.1 * exp(0.2 * (6 / 4 - 1)) = 0.1 * e^0.1
    assert math.isclose(float(l0_control_step(coef, torch.tensor(6.0), 4, 0.2, 1e-5, 1e3)), 0.1 * math.exp(0.1), rel_tol=1e-6)
    # L0 below k lowers it: 0.1 * exp(0.2 * (2 / 4 - 1)) = 0.1 * e^-0.1
    assert math.isclose(float(l0_control_step(coef, torch.tensor(2.0), 4, 0.2, 1e-5, 1e3)), 0.1 * math.exp(-0.1), rel_tol=1e-6)
    # on target: unchanged; far above: the error is clipped to 1; the result is clamped to [low, high]
    assert math.isclose(float(l0_control_step(coef, torch.tensor(4.0), 4, 0.2, 1e-5, 1e3)), 0.1, rel_tol=1e-6)
    assert math.isclose(float(l0_control_step(coef, torch.tensor(40.0), 4, 0.2, 1e-5, 1e3)), 0.1 * math.exp(0.2), rel_tol=1e-6)
    assert math.isclose(float(l0_control_step(coef, torch.tensor(40.0), 4, 0.2, 1e-5, 0.11)), 0.11, rel_tol=1e-6)
    assert math.isclose(float(l0_control_step(coef, torch.tensor(0.0), 4, 0.2, 0.095, 1e3)), 0.095, rel_tol=1e-6)


@pytest.mark.parametrize("method, coef_option, term", [("relu", "l1_coef", "l1"), ("jumprelu", "l0_coef", "l0_penalty")])
def test_training_step_moves_the_coefficient_towards_k(method: str, coef_option: str, term: str) -> None:
    """Identity SAE (pre-activations = x), rows with 2 active latents: k = 1 raises the coefficient,
    k = 4 lowers it, by exactly one controller step; the loss uses the coefficient before the step."""
    x = torch.tensor([[1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 3.0, 1.5]])  # L0 = 2 (JumpReLU thresholds 0.5)
    slack = 1.05 if method == "relu" else 1.0  # ReLU aims 5 % above k (`l0_slack`)
    for k, expected in ((1, 0.1 * math.exp(0.5 * min(2 / (1 * slack) - 1, 1))), (4, 0.1 * math.exp(0.5 * (2 / (4 * slack) - 1)))):
        model = identity_model(method, k=k, **{coef_option: 0.1, "l0_control_rate": 0.5})
        if method == "jumprelu":
            with torch.no_grad():
                model.log_threshold.fill_(math.log(0.5))
        loss, stats = model.training_loss(x, 0.0, GEN)
        assert float(stats["l0"]) == 2.0 and float(stats["penalty_coef"]) == pytest.approx(0.1)
        assert math.isclose(float(model.penalty_coef), expected, rel_tol=1e-6), (k, float(model.penalty_coef))
        loss.backward()  # the in-place update does not break the graph, and no gradient reaches the buffer
        assert not model.penalty_coef.requires_grad and "penalty_coef" in dict(model.named_buffers())
        # the term was weighted by the coefficient before the step (0.1): L1 = mean(3, 4.5), L0 = 2
        assert float(stats[term]) == pytest.approx(0.1 * (3.75 if method == "relu" else 2.0), rel=1e-6)
    fixed = identity_model(method, k=1, **{coef_option: 0.1, "target_l0": False})
    fixed.training_loss(x, 0.0, GEN)
    assert float(fixed.penalty_coef) == pytest.approx(0.1)


@pytest.mark.parametrize("method", ["relu", "jumprelu"])
def test_penalty_coef_survives_save_and_load(method: str, tmp_path) -> None:
    model = build(method, d=8, dict_size=16, k=3, seed=1, l0_control_rate=0.03)
    model.fit_init(torch.randn(64, 8))
    model.penalty_coef.fill_(0.0123)
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)
    assert float(loaded.penalty_coef) == pytest.approx(0.0123)
    assert loaded.options == model.options and loaded.options.target_l0 is True
    assert loaded.options.l0_control_rate == 0.03
    # A checkpoint from before the controller (no penalty_coef) loads with the initial coefficient.
    from safetensors.torch import load_file

    from pipeline.models.checkpoint import save_weights

    state = load_file(str(tmp_path / "model.safetensors"))
    del state["penalty_coef"]
    config = json.loads((tmp_path / "config.json").read_text())
    config["weights_digest"] = save_weights(state, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(config))
    old = load_model(tmp_path)
    assert float(old.penalty_coef) == pytest.approx(getattr(model.options, "l1_coef" if method == "relu" else "l0_coef"))


def train_steps(model: SAE, x: torch.Tensor, steps: int, lr: float, seed: int = 0) -> SAE:
    """The training loop's step (Adam, clipping, decoder projection) at a constant lr, batches of 256."""
    generator = torch.Generator().manual_seed(seed)
    model.fit_init(x)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        loss, _ = model.training_loss(x[torch.randint(0, len(x), (256,), generator=generator)], 0.0, generator)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        model.before_step()
        optimizer.step()
        model.after_step()
    return model.eval()


@pytest.mark.parametrize("method", ["relu", "jumprelu"])
def test_l0_controller_lands_validation_l0_near_k(method: str) -> None:
    """Planted data (d = 16, 64 atoms, 4 per row), held-out rows for the L0. Measured (final val L0 / k,
    k = 4 and 12, seeds 0-2): ReLU 1.03-1.06, JumpReLU 0.99-1.00; asserted within a factor 1.5.
    JumpReLU starts at l0_coef = 0.03 (about where the L0 penalty binds on this data; from the default
    1e-3 the controller needs more steps) and gets lr 2e-2 and a wider kernel, as its thresholds move
    about lr per step. With target_l0=False the coefficient stays at its initial value."""
    torch.manual_seed(0)
    data = torch.as_tensor(planted_sparse(n=2560))
    x, x_val = data[:2048], data[2048:]
    options, steps, lr = ({}, 300, 5e-3) if method == "relu" else ({"l0_coef": 0.03, "bandwidth": 0.01}, 400, 2e-2)
    for k in (4, 12):
        model = train_steps(build(method, d=16, dict_size=64, k=k, seed=0, **options), x, steps, lr)
        l0 = float((model.encode(x_val) != 0).float().sum(1).mean())
        assert k / 1.5 < l0 < 1.5 * k, (method, k, l0)
    initial = 0.05 if method == "relu" else 0.03
    fixed = train_steps(build(method, d=16, dict_size=64, k=4, seed=0, target_l0=False, **options), x, 50, lr)
    assert float(fixed.penalty_coef) == pytest.approx(initial, rel=1e-7)


# --- training on planted sparse data ---------------------------------------------------------------------
@pytest.mark.parametrize("method", SAE_METHODS)
def test_training_on_planted_sparse_data_lowers_fvu(method: str) -> None:
    """x = s D, d = 16, 64 random unit atoms, 4 active per row. Untrained FVU is 0.74 (TopK) to 3.2
    (ReLU with a fixed coefficient); every method must reach FVU < 0.45 and at most half its untrained
    twin's FVU (measured: ReLU 0.14 at L0 20, TopK 0.28, BatchTopK 0.32, JumpReLU 0.36 at L0 3, MSAE
    0.29, prefix 0.33). ReLU runs with its fixed coefficient here (`target_l0=False`): at L0 = k = 4 a
    ReLU SAE's L1 shrinkage costs FVU (~0.58 after this run, against 0.68 for its untrained twin,
    which with `target_l0` also starts at about k active), and the L0 controller has its own tests."""
    x = planted_sparse()
    options = {"target_l0": False} if method == "relu" else {}
    untrained = build(method, d=16, dict_size=64, k=4, seed=0, **options)
    untrained.fit_init(torch.as_tensor(x))
    # JumpReLU's thresholds move about lr per step and only from pre-activations inside the kernel
    # window; at d = 16 the default window (1e-3 * sqrt(16)) is narrow, so give it a wider window and a
    # larger lr for this short run (with the defaults it reaches FVU ~0.43).
    extra = {"lr": 1e-2, "bandwidth": 0.01} if method == "jumprelu" else {"lr": 5e-3}
    model = fit(x, method, dict_size=64, k=4, seed=0, epochs=20, min_steps=0, patience=20, device="cpu", **extra, **options)
    trained_fvu, untrained_fvu = fvu(model, x), fvu(untrained, x)
    assert trained_fvu < 0.45 and trained_fvu < 0.5 * untrained_fvu, (trained_fvu, untrained_fvu)
    if method in ("topk", "batchtopk", "matryoshka", "matryoshka_prefix"):
        assert abs(float((model.encode(x) != 0).sum(1).mean()) - 4) < 0.2


def test_fit_rejects_unknown_options_and_non_sae_methods() -> None:
    x = planted_sparse(n=64)
    with pytest.raises(ValueError, match="unknown options"):
        fit(x, "topk", 64, 4, bogus=1)
    with pytest.raises(ValueError, match="method must be one of"):
        fit(x, "cedar", 64, 4)


def test_relu_rescale_gain_by_hand() -> None:
    """One latent, W_enc = 1, W_dec = 0.5, no biases: codes relu(x) = (0, 1, 2, 3) reconstruct 0.5 x, so the least
    squares gain is 2 and the rescaled decoder row is 1; the encoder is untouched."""
    from pipeline.models.penalty import rescale_gains

    model = ReLUSAE(1, 1, 1, rescale=True)
    with torch.no_grad():
        model.W_enc.fill_(1.0)
        model.W_dec.fill_(0.5)
        model.b_enc.zero_()
        model.b_dec.zero_()
    x = torch.tensor([[-1.0], [1.0], [2.0], [3.0]])
    assert rescale_gains(model, x).tolist() == pytest.approx([2.0])
    model.finish(x)
    assert model.W_dec.item() == pytest.approx(1.0) and model.W_enc.item() == 1.0
    ReLUSAE(1, 1, 1).finish(x)  # off by default: nothing to check but that it runs


def test_relu_rescale_is_least_squares_on_the_sample_and_leaves_dead_latents_alone() -> None:
    """After `finish`, the residual on the sample is orthogonal to every latent's contribution f_i d_i (the normal
    equations), the sample's error did not grow, and a latent active on no row keeps its decoder row."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(500, 8, generator=gen)
    model = ReLUSAE(8, 24, 3, rescale=True)
    model.fit_init(x)
    with torch.no_grad():
        model.b_enc[5] = -1e6  # latent 5 never fires
        before = model.W_dec.clone()
        error_before = float(((model.decode(model.encode(x)) - x) ** 2).sum())
    model.finish(x)
    with torch.no_grad():
        xs = x * model.input_scale
        f = torch.relu(model.pre_activations(xs))
        residual = xs - model.decode_scaled(f)
        normal = (f * (residual @ model.W_dec.T)).sum(0)
        assert float(normal.abs().max()) < 1e-3 * float((f * (xs @ model.W_dec.T)).sum(0).abs().max())
        assert float(((model.decode(model.encode(x)) - x) ** 2).sum()) <= error_before
        assert torch.equal(model.W_dec[5], before[5])


def test_relu_rescale_undoes_the_l1_shrinkage_on_planted_data() -> None:
    from dataclasses import replace

    from pipeline.data.planted import planted
    from pipeline.metrics.reconstruction import fvu
    from pipeline.scoring.planted import oracle_fvu

    data = planted(4000, 16, 3, noise=0.1, seed=0)
    train, held = data.x[:3200], data.x[3200:]
    oracle = oracle_fvu(replace(data, x=held, s=data.s[3200:]), 3)
    scores = {}
    for rescale in (False, True):
        # the published ReLU SAE (controller aimed at k exactly, no resampling): the full L1 shrinkage to undo
        model = fit(train, "relu", 32, 3, seed=0, device="cpu", rescale=rescale, min_steps=600, l0_slack=0.0, resample_every=0.0)
        with torch.no_grad():
            scores[rescale] = fvu(held, np.asarray(model.decode(model.encode(torch.as_tensor(held))))) / oracle
    assert scores[True] < 0.9 * scores[False], scores  # measured: 4.4x -> 3.6x the oracle in this short run


# --- JumpReLU's threshold refit (option refit_thresholds) ------------------------------------------------
REFIT_ROWS = torch.tensor([[3.0, 0, 0, 0], [2.0, 0, 0, 0], [0.1, 0, 0, 0], [0, 4.0, 0, 0], [0, 0.2, 0, -1.0]])


@pytest.mark.parametrize("start", [5.0, 0.05])
def test_refit_thresholds_by_hand(start: float) -> None:
    """Identity atoms, d = 4: keeping pre-activation z lowers a row's per-element squared error by z^2 / 4. Latent 0
    sees z = 3, 2, 0.1 (gains 2.25, 1, 0.0025), latent 1 sees 4, 0.2 (gains 4, 0.01), latents 2 and 3 never a positive z.
    At c = 0.005 latent 0 keeps 3 and 2 (threshold halfway to 0.1: 1.05) and latent 1 both (halfway to 0: 0.1); at
    a target mean L0 of 3/5 the three largest gains stay (thresholds 1.05 and 2.1) and c lies between the gains left
    out and kept (0.01, 1]. Latents that never fire keep their threshold; where the thresholds start (every code cut,
    or every positive one kept) does not matter: each latent's gain is measured without its own code."""
    from pipeline.models.penalty import refit_thresholds

    model = identity_model("jumprelu", k=1, l0_coef=0.005)
    with torch.no_grad():
        model.log_threshold.fill_(math.log(start))
    theta, c, _ = dataclasses.astuple(refit_thresholds(model, REFIT_ROWS, None))
    assert c == pytest.approx(0.005) and theta.tolist() == pytest.approx([1.05, 0.1, start, start])
    theta, c, _ = dataclasses.astuple(refit_thresholds(model, REFIT_ROWS, 3 / 5))
    assert theta.tolist() == pytest.approx([1.05, 2.1, start, start]) and 0.01 < c <= 1.0


def test_jumprelu_finish_refits_thresholds_and_coefficient_only_when_asked() -> None:
    model = identity_model("jumprelu", k=1, l0_coef=0.005, target_l0=False)
    with torch.no_grad():
        model.log_threshold.fill_(math.log(5.0))
    model.finish(REFIT_ROWS)
    assert model.threshold.tolist() == pytest.approx([1.05, 0.1, 5.0, 5.0]) and float(model.penalty_coef) == pytest.approx(0.005)
    assert model.encode(REFIT_ROWS).count_nonzero() == 4
    kept = identity_model("jumprelu", k=1, refit_thresholds=False)
    before = kept.log_threshold.detach().clone()
    kept.finish(REFIT_ROWS)
    assert torch.equal(kept.log_threshold, before)


def test_jumprelu_finish_keeps_the_trained_thresholds_where_the_refit_would_raise_the_objective(caplog: pytest.LogCaptureFixture) -> None:
    """Three latents with the same atom, all off on rows z e0 (z = 2, 1.5, 1): each alone would lower a row's error
    (gain z^2 / 4), so the one-at-a-time refit turns all three on (thresholds 0.5), which reconstructs 3 z e0 (error
    4 z^2 against z^2): `finish` keeps the trained thresholds and the coefficient, and says so."""
    caplog.set_level("INFO", logger="pipeline.models.penalty")
    from pipeline.models.penalty import jumprelu_objective, refit_thresholds

    model = identity_model("jumprelu", k=1, l0_coef=0.005, target_l0=False)
    with torch.no_grad():
        model.W_enc[:3] = model.W_dec[:3] = torch.tensor([1.0, 0, 0, 0])
        model.log_threshold.fill_(math.log(5.0))
    x = torch.tensor([[2.0, 0, 0, 0], [1.5, 0, 0, 0], [1.0, 0, 0, 0]])
    refit = refit_thresholds(model, x, None)
    assert refit.thresholds.tolist() == pytest.approx([0.5, 0.5, 0.5, 5.0])
    # per element: the rows' squared errors (4 + 2.25 + 1) / 12 with every code cut; 4 (...) / 12 + 3 c with all three on
    assert refit.objective_before == pytest.approx(7.25 / 12) == jumprelu_objective(model, x, model.threshold, 0.005)
    assert jumprelu_objective(model, x, refit.thresholds, 0.005) == pytest.approx(4 * 7.25 / 12 + 3 * 0.005)
    model.finish(x)
    assert model.threshold.tolist() == pytest.approx([5.0] * 4) and float(model.penalty_coef) == pytest.approx(0.005)
    assert "keeping the trained thresholds" in caplog.text


def test_refit_thresholds_hits_the_l0_target_and_lowers_every_threshold_as_the_target_rises() -> None:
    """Planted rows (d = 16, 4-sparse, noise 0.05) and a model whose 32 atoms are the planted signed directions,
    started at thresholds that keep every true code: the refitted thresholds keep exactly the counts the refit chose,
    so the mean L0 on the sample is the target up to one step of the L0 curve, and a higher target lowers c, so no
    threshold rises."""
    from pipeline.data.planted import planted
    from pipeline.models.penalty import refit_thresholds

    data = planted(1000, 16, 4, noise=0.05, seed=0)
    x = torch.as_tensor(data.x)
    atoms = torch.as_tensor(np.concatenate([data.q, -data.q]), dtype=torch.float32)
    model = build("jumprelu", d=16, dict_size=32, k=4, seed=0)
    with torch.no_grad():
        model.W_enc.copy_(atoms)
        model.W_dec.copy_(atoms)
        model.b_enc.zero_()
        model.b_dec.copy_(torch.as_tensor(data.b))
        model.input_scale.fill_(1.0)
        model.log_threshold.fill_(math.log(0.25))
    previous = None
    for target in (1.0, 2.0, 4.0):
        theta = refit_thresholds(model, x, target).thresholds
        l0 = float((model.pre_activations(x) > theta).sum(1).float().mean())
        assert abs(l0 - target) < 0.02, (target, l0)
        if previous is not None:
            assert bool((theta <= previous).all())
        previous = theta


def test_refitted_thresholds_reach_the_models_own_top_k_where_the_trained_ones_stop_short() -> None:
    """Planted data (d = 16, k = 2, noise 0.01, dictionary 32, a short run): the trained thresholds stop at the low edge
    of the true codes and cut some of them (measured: 65x the oracle FVU); refitted, they sit in the gap between noise
    and signal and keep exactly what the model's 2 largest pre-activations per row keep (2.1x: the rest is the short
    run's encoder)."""
    from dataclasses import replace as replaced

    from pipeline.data.planted import planted
    from pipeline.metrics.reconstruction import fvu as fvu_of
    from pipeline.models.penalty import refit_thresholds
    from pipeline.scoring.planted import oracle_fvu

    data = planted(3000, 16, 2, noise=0.01, seed=0)
    train, held = data.x[:2400], data.x[2400:]
    oracle = oracle_fvu(replaced(data, x=held, s=data.s[2400:]), 2)
    model = fit(train, "jumprelu", 32, 2, seed=0, device="cpu", min_steps=600, refit_thresholds=False)

    def ratio(codes: torch.Tensor) -> float:
        return fvu_of(held, np.asarray(model.decode(codes))) / oracle

    with torch.no_grad():
        pre = model.pre_activations(torch.as_tensor(held) * model.input_scale)
        top = pre.topk(2, dim=1)
        top_k = ratio(torch.zeros_like(pre).scatter(1, top.indices, top.values))
        trained = ratio(model.encode(torch.as_tensor(held)))
        model.log_threshold.copy_(refit_thresholds(model, torch.as_tensor(train), 2.0).thresholds.log())
        refitted = ratio(model.encode(torch.as_tensor(held)))
    assert refitted == pytest.approx(top_k, rel=1e-3) and trained > 5 * refitted, (trained, refitted, top_k)


# --- the ReLU controller's slack --------------------------------------------------------------------------
def test_relu_aims_its_l0_a_little_above_k_and_lowers_a_coefficient_that_holds_l0_at_k_exactly() -> None:
    """On target (L0 = k exactly) the JumpReLU coefficient stays; ReLU's falls by exp(-rate * slack / (1 + slack)),
    so a coefficient larger than the data need is walked down instead of kept (see `ReLUSAE`, `l0_slack`)."""
    x = torch.tensor([[1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 3.0, 1.5]])  # L0 = 2
    relu = identity_model("relu", k=2, l1_coef=0.1, l0_control_rate=0.5)
    assert relu.l0_target == pytest.approx(2.1)
    relu.training_loss(x, 0.0, GEN)
    assert float(relu.penalty_coef) == pytest.approx(0.1 * math.exp(0.5 * (2 / 2.1 - 1)), rel=1e-6)
    exact = identity_model("relu", k=2, l1_coef=0.1, l0_control_rate=0.5, l0_slack=0.0)
    exact.training_loss(x, 0.0, GEN)
    assert float(exact.penalty_coef) == pytest.approx(0.1)
    jump = identity_model("jumprelu", k=2, l0_coef=0.1, l0_control_rate=0.5)
    with torch.no_grad():
        jump.log_threshold.fill_(math.log(0.5))
    jump.training_loss(x, 0.0, GEN)
    assert jump.l0_target == 2.0 and float(jump.penalty_coef) == pytest.approx(0.1)


# --- resampling (options resample_every, resample_until, resample_margin) ------------------------------------
def test_residual_directions_by_hand() -> None:
    """Residual rows 3 e0, 2 e0, e1, -e1: second moment diag(13, 2); e0 first (all its energy on the + side,
    gain 13), then e1 (half its energy on each side: gain 2 * 1/2 = 1, sign + on a tie)."""
    residual = torch.tensor([[3.0, 0.0], [2.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    directions, gains = residual_directions(residual.T @ residual, residual)
    assert torch.allclose(directions, torch.eye(2)) and torch.allclose(gains, torch.tensor([13.0, 1.0]))
    flipped, gains = residual_directions(residual.T @ residual, -residual)
    assert torch.allclose(flipped, torch.tensor([[-1.0, 0.0], [0.0, 1.0]])) and torch.allclose(gains, torch.tensor([13.0, 1.0]))


def test_sparse_directions_untangle_mixtures_of_missing_directions() -> None:
    """Residual rows each along one of three orthonormal directions (a row misses one direction); the starting
    directions are mixtures of all three (cosines 0.58, 0.71, 0.82 to their nearest), as the eigenvectors of a
    degenerate second moment are. The refinement returns each direction exactly once, orthonormal; 0 rounds return
    the input; a direction that is already one of them stays."""
    generator = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(6, 6, generator=generator))[0][:3]
    rows = basis[torch.arange(300) % 3] * (torch.rand(300, 1, generator=generator) + 0.5)
    mix = torch.tensor([[1.0, 1.0, 1.0], [1.0, -1.0, 0.0], [1.0, 1.0, -2.0]])
    start = (mix / mix.norm(dim=1, keepdim=True)) @ basis
    refined = sparse_directions(start, rows, 20)
    cosines = refined @ basis.T
    assert sorted(cosines.argmax(1).tolist()) == [0, 1, 2], "each planted direction found once"
    assert torch.allclose(cosines.amax(1), torch.ones(3), atol=1e-5)
    assert torch.allclose(refined @ refined.T, torch.eye(3), atol=1e-5)
    assert torch.equal(sparse_directions(start, rows, 0), start)
    assert torch.allclose(sparse_directions(basis[1:2], rows, 20), basis[1:2], atol=1e-6)
    assert torch.allclose(sparse_directions(basis[1:2], -rows, 20), basis[1:2]), "no row on its positive side: kept"


def test_replacements_by_hand() -> None:
    """Directions by gain (5, 3, 1) meet latents by usage (0, 2, 4, 10): 5 > 0 and 3 > 2 move latents 0 and 2;
    1 < 4 stops the pairing. A margin of 2 stops it after the first pair (3 < 2 * 2)."""
    gains, usage = torch.tensor([1.0, 5.0, 3.0]), torch.tensor([0.0, 4.0, 2.0, 10.0])
    latents, directions = replacements(gains, usage, 1.0)
    assert latents.tolist() == [0, 2] and directions.tolist() == [1, 2]
    latents, directions = replacements(gains, usage, 2.0)
    assert latents.tolist() == [0] and directions.tolist() == [1]
    latents, directions = replacements(torch.zeros(3), torch.zeros(4), 1.0)
    assert latents.tolist() == [] == directions.tolist(), "nothing to gain: nothing moves, not even an unused latent"


def test_unshared_fraction_by_hand() -> None:
    """Atoms e0, e0 (a duplicate), (e0 + e1)/sqrt 2, -e0 and e2; usage 5, 1, 3, 0, 2. The busier e0 keeps 1 (no atom
    used as much at an acute angle), its duplicate 0; the diagonal atom 1 - 1/2 (cosine 1/sqrt 2 with the busier e0);
    -e0 is at an obtuse angle to everything (its direction cannot be taken over by a non-negative code) and e2 is
    orthogonal: both 1."""
    h = 1 / math.sqrt(2)
    atoms = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [h, h, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    fraction = unshared_fraction(atoms, torch.tensor([5.0, 1.0, 3.0, 0.0, 2.0]))
    assert torch.allclose(fraction, torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0]), atol=1e-6)


def dead_fourth_latent(method: str, **options: object) -> SAE:
    """Identity SAE (d = 4, 4 latents, k = 1) whose latent 3 duplicates atom e0 and never fires (encoder -e0): the
    direction e3 of the data has no latent."""
    model = identity_model(method, k=1, **{"resample_every": 0.5, "resample_until": 1.0, **options})
    with torch.no_grad():
        model.W_dec[3] = torch.tensor([1.0, 0.0, 0.0, 0.0])
        model.W_enc[3] = torch.tensor([-1.0, 0.0, 0.0, 0.0])
    return model


@pytest.mark.parametrize("method", ["topk", "batchtopk", "relu", "jumprelu", "matryoshka"])
def test_resampling_moves_an_unused_latent_onto_the_missing_direction(method: str) -> None:
    x = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0], [0.0, 0.0, 1.5, 0.0], [0.0, 0.0, 0.0, 2.0], [0.0, 0.0, 0.0, 1.0]])
    model = dead_fourth_latent(method)
    if method == "jumprelu":
        with torch.no_grad():
            model.log_threshold.copy_(torch.tensor([0.1, 0.2, 0.3, 5.0]).log())
    _, stats = model.training_loss(x, 0.0, GEN)  # records the residual (e3 unexplained) and the usage (latent 3: none)
    assert float(stats["resampled"]) == 0 and float(model.usage[3]) == 0 and float(model.residual_moment[3, 3]) == pytest.approx(5.0)
    _, stats = model.training_loss(x, 0.5, GEN)  # a round is due: latent 3 moves before the forward pass
    assert float(stats["resampled"]) == 1 and int(model.resample_rounds) == 1
    with torch.no_grad():
        assert torch.allclose(model.W_dec[3], torch.tensor([0.0, 0.0, 0.0, 1.0]), atol=1e-6)
        assert torch.allclose(model.W_enc[3], torch.tensor([0.0, 0.0, 0.0, 1.0]), atol=1e-6), "at the mean norm (1) of the others"
        assert torch.equal(model.W_dec[:3], torch.eye(4)[:3]), "the used latents are untouched"
        assert model.encode(x[3:4])[0, 3] > 0, "the moved latent now fires on its direction"
    if method == "jumprelu":
        assert float(model.threshold[3].detach()) == pytest.approx(0.2), "its threshold: the median of the others'"


def test_no_resampling_when_off_after_its_last_round_or_when_every_latent_earns_its_place() -> None:
    x = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0]])
    off = dead_fourth_latent("topk", resample_every=0.0)
    off.training_loss(x, 0.0, GEN)
    _, stats = off.training_loss(x, 0.6, GEN)
    assert float(stats["resampled"]) == 0 and float(off.residual_moment.abs().sum()) == 0, "off: nothing recorded"
    assert off.curriculum_end == 0.0 and dead_fourth_latent("topk").curriculum_end == 1.0
    late = dead_fourth_latent("topk", resample_until=0.4)
    late.training_loss(x, 0.0, GEN)
    _, stats = late.training_loss(x, 0.5, GEN)
    assert float(stats["resampled"]) == 0 and int(late.resample_rounds) == 0
    fitted = identity_model("topk", k=1, resample_every=0.5, resample_until=1.0)  # every direction has its latent
    fitted.training_loss(x, 0.0, GEN)
    _, stats = fitted.training_loss(x, 0.5, GEN)
    assert float(stats["resampled"]) == 0 and int(fitted.resample_rounds) == 1


@pytest.mark.parametrize("method", SAE_METHODS)
def test_resampling_state_survives_save_and_load_and_older_checkpoints_still_load(method: str, tmp_path) -> None:
    model = build(method, d=6, dict_size=12, k=3, seed=0)
    model.fit_init(torch.randn(32, 6))
    model.training_loss(torch.randn(16, 6), 0.01, GEN)
    model.resample_rounds.fill_(2)
    save_model(model, tmp_path / "new")
    loaded = load_model(tmp_path / "new")
    for name in SAE.RESAMPLING_BUFFERS:
        assert torch.equal(getattr(loaded, name), getattr(model, name)), name
    old = {k: v for k, v in model.state_dict().items() if k not in SAE.RESAMPLING_BUFFERS}
    rebuilt = build(method, d=6, dict_size=12, k=3, seed=1)
    rebuilt.load_state_dict(old)
    assert torch.equal(rebuilt.W_dec, model.W_dec) and int(rebuilt.resample_rounds) == 0


def planted_directions_found(method: str, d: int, k: int, **options: object) -> tuple[list[int], list[float]]:
    """Fit `method` (dictionary 2d, one latent per signed direction) on planted data (3,000 rows, d, k, noise 0.01, 80 %
    for training), seeds 0-2, with `options`; per seed, how many planted directions have an atom within cosine 0.99,
    and the held-out FVU over the oracle's."""
    from dataclasses import replace as replaced

    from pipeline.data.planted import planted
    from pipeline.metrics.reconstruction import fvu as fvu_of
    from pipeline.scoring.planted import oracle_fvu

    counts, ratios = [], []
    for seed in range(3):
        data = planted(3000, d, k, noise=0.01, seed=seed)
        train, held = data.x[:2400], data.x[2400:]
        model = fit(train, method, 2 * d, k, seed=seed, device="cpu", min_steps=600, **options)
        cos = model.W_dec.detach().double().numpy() @ np.concatenate([data.q, -data.q]).T
        counts.append(len(set(cos.argmax(1)[cos.max(1) > 0.99])))
        ratios.append(fvu_of(held, np.asarray(model.decode(model.encode(held)))) / oracle_fvu(replaced(data, x=held, s=data.s[2400:]), k))
    return counts, ratios


def test_resampling_finds_every_planted_direction_that_training_alone_misses() -> None:
    """Planted data (d = 8, 16 signed directions, dictionary 16, k = 2, noise 0.01, seeds 0-2): without resampling
    seed 2 ends with 3 directions without an atom (measured: 16, 16, 13 of 16 found within cos 0.99; FVU 1.1x, 1.0x,
    449x the oracle's), with it every direction has its own (16 of 16 each; 1.2x, 1.7x, 1.1x)."""
    found = {every: planted_directions_found("topk", 8, 2, resample_every=every) for every in (0.0, 0.05)}
    assert found[0.05][0] == [16, 16, 16] and max(found[0.05][1]) < 2, found
    assert min(found[0.0][0]) < 16, found


def test_untangled_by_hand() -> None:
    """Direction e2 (moved onto by latent 0). Atom 1 = (0.6, 0, 0.8) shares it at cosine 0.8: it becomes e0; atom 2 =
    (0.98, 0, 0.2) is at cosine 0.2, not above the threshold: unchanged; atom 3 = -e2 is at an obtuse angle:
    unchanged; latent 0 itself keeps e2. Threshold 1 changes nothing."""
    atoms = torch.tensor([[0.0, 0.0, 1.0], [0.6, 0.0, 0.8], [0.98, 0.0, 0.2], [0.0, 0.0, -1.0]])
    atoms[2] /= atoms[2].norm()
    direction, moved = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([0])
    result = untangled(atoms, direction, moved, 0.2)
    assert torch.allclose(result[1], torch.tensor([1.0, 0.0, 0.0]))
    assert torch.equal(result[[0, 2, 3]], atoms[[0, 2, 3]])
    assert torch.equal(untangled(atoms, direction, moved, 1.0), atoms)


def test_refined_resampling_finds_every_planted_direction_for_batchtopk() -> None:
    """Planted data (d = 16, 32 signed directions, dictionary 32, k = 2, noise 0.01, seeds 0-2), BatchTopK: resampling
    onto the residual's principal directions as they are (`resample_refine=0`, `resample_untangle=1`) leaves
    directions without an atom (measured: 29, 29, 26 of 32; FVU 29x, 23x, 52x the oracle's); with the defaults (refined
    towards the sparse directions they mix, the atoms that covered part of them untangled) every direction gets its
    own (32 of 32 each; 1.7x, 1.8x, 2.0x)."""
    plain = planted_directions_found("batchtopk", 16, 2, resample_refine=0, resample_untangle=1.0)
    defaults = planted_directions_found("batchtopk", 16, 2)
    assert defaults[0] == [32, 32, 32] and max(defaults[1]) < 3, defaults
    assert min(plain[0]) < 32 and max(plain[1]) > 10, plain


def test_deviations_name_real_options_and_published_values_are_valid_and_differ_from_the_defaults() -> None:
    from pipeline.models.options import DEVIATIONS, PUBLISHED, options_class

    for method, options in DEVIATIONS.items():
        fields = {f.name: f.default for f in dataclasses.fields(options_class(method))}
        assert set(options) <= set(fields), method
    for method, published in PUBLISHED.items():
        defaults = dataclasses.asdict(options_class(method)())
        assert set(published) <= set(DEVIATIONS[method]), "the report names every option whose default departs"
        assert all(defaults[name] != value for name, value in published.items()), method
        build(method, 4, 16, 4, seed=0, **published)  # the published recipe is a valid configuration
