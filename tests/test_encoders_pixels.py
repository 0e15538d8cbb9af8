"""pipeline.encoders.pixels: pixel batches from uint8 arrays or preprocessed tensors, and the normalised forward loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision.transforms import ToTensor

from pipeline.encoders.pixels import encode_pixels, pixel_batches

H, W = 6, 8
TO_TENSOR = ToTensor()


def colour(i: int) -> tuple[int, int, int]:
    return (10 * i, 20 + i, 255 - 5 * i)


def expected_pixels(i: int) -> torch.Tensor:
    return torch.tensor(colour(i), dtype=torch.float32).div(255).view(3, 1, 1).expand(3, H, W)


def test_pixel_batches_from_uint8_and_from_tensors():
    images = np.stack([np.full((H, W, 3), colour(i), dtype=np.uint8) for i in range(5)])
    batches = list(pixel_batches(images, TO_TENSOR, batch_size=2))
    assert [b.shape[0] for b in batches] == [2, 2, 1]
    torch.testing.assert_close(torch.cat(batches), torch.stack([expected_pixels(i) for i in range(5)]), rtol=0, atol=0)
    pixels = torch.rand(5, 3, 4, 4)
    again = list(pixel_batches(pixels, TO_TENSOR, batch_size=3, input_size=(4, 4)))
    torch.testing.assert_close(torch.cat(again), pixels, rtol=0, atol=0)


@pytest.mark.parametrize(
    "images, error, message",
    [
        (torch.zeros(2, 3, 4, 4, dtype=torch.uint8), TypeError, "float tensor"),
        (torch.zeros(2, 4, 4), ValueError, r"\(n, 3, h, w\)"),
        (torch.zeros(0, 3, 4, 4), ValueError, "at least one image"),
        (torch.zeros(2, 3, 5, 4), ValueError, "4x4 pixels"),
        (torch.full((1, 3, 4, 4), float("nan")), ValueError, "NaN"),
        (np.zeros((2, 4, 4, 3), dtype=np.float32), TypeError, "uint8"),
        ([[0]], TypeError, "numpy uint8 array"),
    ],
)
def test_pixel_batches_rejects_bad_images(images, error, message):
    with pytest.raises(error, match=message):
        next(pixel_batches(images, TO_TENSOR, batch_size=2, input_size=(4, 4)))


def test_encode_pixels_normalises_rows_in_float32():
    # forward = flatten: a constant image c gives a vector of 48 equal values -> every entry 1/sqrt(48).
    pixels = torch.stack([torch.full((3, 4, 4), 0.5), torch.full((3, 4, 4), 2.0), torch.arange(48.0).view(3, 4, 4)])
    out = encode_pixels(lambda x: x.flatten(1).double(), pixels, TO_TENSOR, batch_size=2, device=torch.device("cpu"))
    assert out.dtype == np.float32 and out.shape == (3, 48)
    np.testing.assert_allclose(out[:2], np.full((2, 48), 1 / np.sqrt(48)), rtol=1e-6)
    np.testing.assert_allclose(out[2], np.arange(48.0) / np.linalg.norm(np.arange(48.0)), rtol=1e-6)


# --- preprocessing on the device: equal to the libraries' own ---------------------------------------------------------

import open_clip  # noqa: E402
from PIL import Image  # noqa: E402

from pipeline.data.world.scenes import render_scene  # noqa: E402
from pipeline.encoders.pixels import PilTransform, centre_crop, device_batches, pil_resize, pil_transform_of, shorter_side_size  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SIZES = [(40, 40), (97, 130), (300, 256), (224, 224), (20, 50), (33, 31)]


def sample_images(height: int, width: int, kind: str, seed: int = 0) -> np.ndarray:
    """uint8 (2, height, width, 3): random noise (the hardest case for a resampler), or two scenes of the rendered
    world (smooth regions and edges), rendered at the larger side and cropped to (height, width)."""
    if kind == "random":
        return np.random.default_rng(seed).integers(0, 256, (2, height, width, 3), dtype=np.uint8)
    side = max(height, width)
    return np.stack([render_scene(k, seed, image_size=side)[:height, :width] for k in ("objects", "multi")])


@pytest.mark.parametrize("filter_name", ["bicubic", "bilinear"])
@pytest.mark.parametrize("height, width", SIZES)
def test_pil_resize_equals_pil_bit_for_bit(height, width, filter_name):
    images = sample_images(height, width, "random", seed=height)
    modes = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR}
    for size in [(32, 32), (224, 224), (17, 61), (height, width + 9)]:
        expected = np.stack([np.asarray(Image.fromarray(im).resize(size[::-1], modes[filter_name])) for im in images])
        got = pil_resize(torch.from_numpy(images).permute(0, 3, 1, 2), size, filter_name).permute(0, 2, 3, 1).numpy()
        np.testing.assert_array_equal(got, expected, err_msg=f"{height}x{width} -> {size}")


def test_resize_and_crop_geometry_follow_torchvision():
    from torchvision.transforms import CenterCrop, Resize

    for height, width in SIZES + [(1, 7), (500, 375)]:
        image = Image.new("RGB", (width, height))
        assert shorter_side_size(height, width, 32) == Resize(32)(image).size[::-1]
        for crop in [(16, 16), (31, 20), (40, 60)]:
            tensor = torch.arange(height * width * 3, dtype=torch.float32).view(1, 3, height, width)
            torch.testing.assert_close(centre_crop(tensor, crop), CenterCrop(crop)(tensor), rtol=0, atol=0)


def open_clip_transforms() -> dict[str, object]:
    """open_clip's own inference transforms: its default (shortest side, bicubic, CLIP mean/std), squash, longest."""
    return {mode: open_clip.image_transform(32, is_train=False, resize_mode=mode) for mode in ("shortest", "squash", "longest")}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["random", "rendered"])
def test_open_clip_preprocessing_on_the_device_equals_open_clips_own(kind, device):
    transforms = open_clip_transforms()
    assert pil_transform_of(transforms["longest"]) is None, "a resize mode it does not mirror: image by image"
    for mode in ("shortest", "squash"):
        mirror = pil_transform_of(transforms[mode])
        assert isinstance(mirror, PilTransform) and mirror.interpolation == "bicubic"
        for height, width in SIZES:
            images = sample_images(height, width, kind)
            expected = torch.stack([transforms[mode](Image.fromarray(im)) for im in images])
            (got,) = device_batches(images, 8, torch.device(device), mirror)
            assert got.device.type == device and got.dtype == torch.float32
            # the spec: within 1e-2 of the library's pixels; here they are equal (float32 division order aside)
            torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["random", "rendered"])
def test_open_clip_embeddings_from_device_preprocessing_match_the_per_image_path(kind, tmp_path):
    from pipeline.encoders.openclip import OpenClipEncoder
    from tests.test_encoders_real import OPEN_CLIP_CONFIG

    config = tmp_path / "pixels-tiny-vit.json"
    config.write_text(__import__("json").dumps(OPEN_CLIP_CONFIG))
    encoder = OpenClipEncoder("pixels-tiny-vit", None, device="cpu", model_config=config)
    assert encoder.device_preprocess is not None
    for height, width in SIZES:
        images = sample_images(height, width, kind, seed=1)
        device_path = encoder.encode_images(images, batch_size=4)
        per_image = encoder.encode_images(torch.stack([encoder.preprocess(Image.fromarray(im)) for im in images]), batch_size=4)
        cosine = (device_path * per_image).sum(1)
        assert cosine.min() >= 0.999, cosine


@pytest.mark.parametrize("kind", ["random", "rendered"])
def test_transformers_preprocessing_on_the_device_is_the_processors_own(kind, tmp_path):
    from transformers import BitImageProcessor, BlipImageProcessor, CLIPImageProcessor

    from pipeline.encoders.hf import ImageProcessorTransform
    from pipeline.encoders.pixels import processor_on_device

    processors = [CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
                  BitImageProcessor(size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32}),
                  BlipImageProcessor(size={"height": 32, "width": 32})]
    for processor in processors:
        on_device, per_image = processor_on_device(processor), ImageProcessorTransform(processor)
        assert on_device is not None, f"{type(processor).__name__}: transformers' default backend is torchvision"
        for height, width in SIZES:
            images = sample_images(height, width, kind)
            expected = torch.stack([per_image(Image.fromarray(im)) for im in images])
            for device in DEVICES:
                (got,) = device_batches(images, 8, torch.device(device), on_device)
                # on a GPU the library's own resize may round a tie to the other uint8 level: one level at most
                level = 1 / 255 / min(processor.image_std) + 1e-6
                torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=1e-6 if device == "cpu" else level)
