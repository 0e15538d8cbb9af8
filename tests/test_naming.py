"""Concept naming of latents and concept explanations of images (pipeline.explain.naming)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import Tensor

from pipeline.explain.naming import LatentNames, dense_explanations, explain_images, latent_directions, name_latents
from pipeline.models.base import SparseModel
from pipeline.models.registry import build

# 3 concepts in d = 2; the text mean is (5/3, 5/3).
CONCEPTS = ["warm", "cold", "grey"]
CONCEPT_EMB = np.array([[3.0, 1.0], [1.0, 3.0], [1.0, 1.0]])
TEXT_MEAN = CONCEPT_EMB.mean(0)
# 2 latents: the half-axes +u and -u of u = (1, 0), given unnormalised
DIRECTIONS = np.array([[2.0, 0.0], [-0.5, 0.0]])


# --- latent_directions -------------------------------------------------------------------------------
def test_rotation_directions_are_plus_then_minus_axes_in_latents_order() -> None:
    model = build("random_rotation", d=4, dict_size=4, k=2, seed=1)
    u = model.rotation
    dirs = latent_directions(model)
    assert dirs.shape == (8, 4) and dirs.dtype == np.float32
    np.testing.assert_allclose(dirs[:4], u, atol=1e-6)
    np.testing.assert_allclose(dirs[4:], -u, atol=1e-6)
    # the column order matches model.latents(): a code +3 on axis 1 lights latent 1, -2 on axis 2 lights latent 4 + 2
    codes = torch.tensor([[0.0, 3.0, -2.0, 0.0]])
    assert torch.equal(model.latents(codes), torch.tensor([[0.0, 3.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0]]))


def test_sae_directions_are_unit_decoder_rows() -> None:
    model = build("topk", d=6, dict_size=10, k=2, seed=0)
    with torch.no_grad():
        model.W_dec.mul_(torch.linspace(0.5, 2.0, 10)[:, None])  # non-unit rows: directions must be normalised
    dirs = latent_directions(model)
    expected = model.W_dec.detach().numpy()
    expected = expected / np.linalg.norm(expected, axis=1, keepdims=True)
    assert dirs.shape == (10, 6)
    np.testing.assert_allclose(dirs, expected, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(dirs, axis=1), 1.0, atol=1e-6)


class _LinearModel(SparseModel):
    """A model without a rotation or W_dec: decode(c) = c M + offset."""

    method = "linear_test"

    def __init__(self) -> None:
        super().__init__(d=2, n_latents=3, k=1)
        self.register_buffer("m", torch.tensor([[3.0, 4.0], [0.0, -2.0], [1.0, 0.0]]))

    def decode(self, codes: Tensor) -> Tensor:
        codes = torch.as_tensor(np.asarray(codes), dtype=torch.float32)
        return codes @ self.m + torch.tensor([10.0, -7.0])


def test_other_models_get_directions_from_decode_differences() -> None:
    dirs = latent_directions(_LinearModel())
    np.testing.assert_allclose(dirs, [[0.6, 0.8], [0.0, -1.0], [1.0, 0.0]], atol=1e-6)


def test_latent_directions_rejects_non_models() -> None:
    with pytest.raises(TypeError, match="model"):
        latent_directions(np.eye(3))  # type: ignore[arg-type]


# --- name_latents -----------------------------------------------------------------------------------
def test_naming_without_centring_hand_computed() -> None:
    names = name_latents(DIRECTIONS, CONCEPT_EMB, CONCEPTS, top=3)
    # cos((1,0), c) = 3/sqrt(10), 1/sqrt(10), 1/sqrt(2); the -u latent gets the negatives
    assert names.names.tolist() == [["warm", "grey", "cold"], ["cold", "grey", "warm"]]
    np.testing.assert_allclose(names.scores[0], [3 / math.sqrt(10), 1 / math.sqrt(2), 1 / math.sqrt(10)], rtol=1e-6)
    np.testing.assert_allclose(names.scores[1], [-1 / math.sqrt(10), -1 / math.sqrt(2), -3 / math.sqrt(10)], rtol=1e-6)
    assert names.indices.tolist() == [[0, 2, 1], [1, 2, 0]]
    assert names.best == ["warm", "cold"]


def test_naming_with_centring_hand_computed_and_opposite_half_axes() -> None:
    names = name_latents(DIRECTIONS, CONCEPT_EMB, CONCEPTS, top=3, text_mean=TEXT_MEAN)
    # centred concepts: (4/3, -2/3), (-2/3, 4/3), (-2/3, -2/3): cos with (1, 0) = 2/sqrt(5), -1/sqrt(5), -1/sqrt(2)
    assert names.names.tolist() == [["warm", "cold", "grey"], ["grey", "cold", "warm"]]
    np.testing.assert_allclose(names.scores[0], [2 / math.sqrt(5), -1 / math.sqrt(5), -1 / math.sqrt(2)], rtol=1e-6)
    np.testing.assert_allclose(names.scores[1], [1 / math.sqrt(2), 1 / math.sqrt(5), -2 / math.sqrt(5)], rtol=1e-6)
    # centring changed the name of the -u half-axis ("cold" -> "grey"), and +u / -u are named differently
    assert names.best[0] != names.best[1]


def test_naming_top_and_ties_break_by_lower_concept_index() -> None:
    emb = np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    names = name_latents(np.array([[1.0, 0.0]]), emb, ["a", "b", "c"], top=2)
    assert names.names.tolist() == [["b", "c"]] and names.scores.shape == (1, 2)
    np.testing.assert_allclose(names.scores, [[1.0, 1.0]])


def test_naming_matches_a_per_latent_loop() -> None:
    rng = np.random.default_rng(0)
    dirs, emb = rng.standard_normal((7, 5)), rng.standard_normal((11, 5))
    concepts = [f"c{i}" for i in range(11)]
    names = name_latents(dirs, emb, concepts, top=4, text_mean=emb.mean(0))
    centred = emb - emb.mean(0)
    for i, direction in enumerate(dirs):
        cos = centred @ direction / (np.linalg.norm(centred, axis=1) * np.linalg.norm(direction))
        np.testing.assert_array_equal(names.indices[i], np.argsort(-cos)[:4])
        np.testing.assert_allclose(names.scores[i], np.sort(cos)[::-1][:4], rtol=1e-5)


def test_naming_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="concept_embeddings: expected 2 columns"):
        name_latents(DIRECTIONS, np.ones((3, 5)), CONCEPTS)
    with pytest.raises(ValueError, match="empty vocabulary"):
        name_latents(DIRECTIONS, np.zeros((0, 2)), [])
    with pytest.raises(ValueError, match="concepts: expected 3 names"):
        name_latents(DIRECTIONS, CONCEPT_EMB, ["a", "b"])
    with pytest.raises(ValueError, match="top"):
        name_latents(DIRECTIONS, CONCEPT_EMB, CONCEPTS, top=4)
    with pytest.raises(ValueError, match="text_mean"):
        name_latents(DIRECTIONS, CONCEPT_EMB, CONCEPTS, text_mean=np.zeros(3))
    with pytest.raises(ValueError, match="directions: contains NaN"):
        name_latents(np.array([[np.nan, 0.0]]), CONCEPT_EMB, CONCEPTS)
    with pytest.raises(ValueError, match="directions: expected a 2-D"):
        name_latents(np.ones(2), CONCEPT_EMB, CONCEPTS)


# --- explain_images ---------------------------------------------------------------------------------
def _names(best: list[str]) -> LatentNames:
    n = len(best)
    return LatentNames(names=np.array(best, dtype=object)[:, None], scores=np.ones((n, 1), np.float32), indices=np.zeros((n, 1), np.int64))


def test_explanations_list_active_latents_largest_first() -> None:
    names = _names(["red", "tree", "dog", "sky"])
    codes = np.array([
        [0.5, 2.0, 0.0, 1.0],   # tree, sky, red
        [0.0, 0.0, 0.0, 0.0],   # nothing active
        [3.0, 0.0, 3.0, 0.0],   # tie: lower latent index first
    ])
    out = explain_images(codes, names, top=5)
    assert out == [[("tree", 2.0), ("sky", 1.0), ("red", 0.5)], [], [("red", 3.0), ("dog", 3.0)]]
    assert explain_images(codes, names, top=2)[0] == [("tree", 2.0), ("sky", 1.0)]


def test_explanations_merge_latents_with_the_same_name() -> None:
    names = _names(["red", "tree", "red", "sky"])
    out = explain_images(np.array([[1.0, 0.5, 4.0, 2.0]]), names, top=3)
    assert out == [[("red", 4.0), ("sky", 2.0), ("tree", 0.5)]]


def test_explanations_of_signed_codes_through_latents() -> None:
    model = build("identity", d=2, dict_size=2, k=1)
    # centred: +e1 -> warm, +e2 -> cold, -e1 and -e2 -> grey
    names = name_latents(latent_directions(model), CONCEPT_EMB, CONCEPTS, top=1, text_mean=TEXT_MEAN)
    codes = model.latents(torch.tensor([[-2.0, 0.5], [1.0, 0.0]])).numpy()
    assert explain_images(codes, names) == [[("grey", 2.0), ("cold", 0.5)], [("warm", 1.0)]]


def test_explanation_errors_are_clear() -> None:
    names = _names(["a", "b"])
    with pytest.raises(ValueError, match="codes_latents: expected 2 columns"):
        explain_images(np.ones((1, 3)), names)
    with pytest.raises(ValueError, match="non-negative"):
        explain_images(np.array([[1.0, -1.0]]), names)
    with pytest.raises(TypeError, match="names"):
        explain_images(np.ones((1, 2)), ["a", "b"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="top"):
        explain_images(np.ones((1, 2)), names, top=0)


# --- dense_explanations -----------------------------------------------------------------------------
def test_dense_explanations_hand_computed() -> None:
    x = np.array([[2.0, 1.0], [1.0, 2.0]])
    out = dense_explanations(x, image_mean=np.array([1.0, 1.0]), concept_embeddings=CONCEPT_EMB, concepts=CONCEPTS, top=2, text_mean=TEXT_MEAN)
    # centred images (1, 0) and (0, 1); centred concepts as in the centring test
    assert [[name for name, _ in row] for row in out] == [["warm", "cold"], ["cold", "warm"]]
    np.testing.assert_allclose([s for _, s in out[0]], [2 / math.sqrt(5), -1 / math.sqrt(5)], rtol=1e-6)
    with pytest.raises(ValueError, match="image_mean"):
        dense_explanations(x, np.zeros(3), CONCEPT_EMB, CONCEPTS)
