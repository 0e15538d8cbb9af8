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
