"""Pixel batches for the encoders: uint8 image arrays or preprocessed tensors -> forward passes -> unit embeddings.

Two ways from uint8 images to the pixels a model takes, both equal to the library's own preprocessing:

- on the device, batched (`DevicePreprocess`): a uint8 batch (n, H, W, 3) is copied to the encoder's device
  (page-locked, non-blocking) and preprocessed there as batched torch ops. For open_clip (`PilTransform`, read from
  the torchvision transform open_clip built): torchvision's `Resize` of a PIL image (PIL's resampling, reproduced
  exactly: its fixed-point filter coefficients and its two passes, each rounded to uint8, in the order the
  installed PIL takes them for the sizes at hand, `pil_pass_order`),
  `CenterCrop` (offsets rounded as torchvision rounds them, zero padding when the crop is larger), `ToTensor`,
  `Normalize`; the pixels equal open_clip's bit for bit on the CPU. For transformers (`ProcessorOnDevice`): the
  image processor itself, when it is a torchvision-backed one (batched tensors on any device). An encoder whose
  transform has a step not mirrored here has no `device_preprocess` and takes the second way;
- per image (`pixel_batches`): through PIL and the encoder's own `preprocess`, one image at a time, as the file
  path of `pipeline.data.images` does (DataLoader workers), or already preprocessed float tensors.

`encode_pixels` runs a forward function over them and returns L2-normalised float32 numpy rows (bfloat16 autocast
on a GPU).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from pipeline.encoders.base import check_batch_size, check_images

log = logging.getLogger(__name__)

Transform = Callable[[Image.Image], Tensor]
#: uint8 (n, H, W, 3) on the encoder's device -> float32 (n, 3, h, w) pixels, the encoder's preprocessing batched
DevicePreprocess = Callable[[Tensor], Tensor]

# --- PIL's resampling as batched torch ops ---------------------------------------------------------------------------

#: PIL's filters by name: (function of the distance in input pixels, support)
_FILTERS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], float]] = {
    "bilinear": (lambda x: np.where(np.abs(x) < 1.0, 1.0 - np.abs(x), 0.0), 1.0),
    "bicubic": (lambda x: _bicubic(np.abs(x)), 2.0),
}
#: fixed-point bits of PIL's 8-bit resampling coefficients
_PRECISION_BITS = 32 - 8 - 2


def _bicubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
    """PIL's bicubic convolution kernel (a = -0.5) at distances x >= 0, evaluated in PIL's order of operations."""
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def pil_coefficients(in_size: int, out_size: int, name: str) -> np.ndarray:
    """float64 (in_size, out_size): PIL's fixed-point weights of one resampling pass (output j = sum over i of
    input i x weight[i, j], then + 2^21, >> 22, clipped to 0..255), integers held exactly in float64. As PIL computes
    them: support scaled by the reduction factor, taps from round(centre -+ support), the kernel at (tap - centre +
    0.5) / scale, normalised by their sequential sum, rounded half away from zero to 22 fractional bits."""
    kernel, support = _FILTERS[name]
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = support * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    centre = (np.arange(out_size) + 0.5) * scale
    xmin = np.maximum(np.trunc(centre - support + 0.5).astype(np.int64), 0)
    xmax = np.minimum(np.trunc(centre + support + 0.5).astype(np.int64), in_size) - xmin
    taps = np.arange(ksize)
    weights = kernel(((taps[None, :] + xmin[:, None]) - centre[:, None] + 0.5) * (1.0 / filterscale))
    weights = np.where(taps[None, :] < xmax[:, None], weights, 0.0)
    total = np.cumsum(weights, axis=1)[:, -1:]  # PIL sums the taps in order
    weights = np.where(total != 0.0, weights / np.where(total != 0.0, total, 1.0), weights)
    fixed = np.where(weights < 0, np.trunc(-0.5 + weights * (1 << _PRECISION_BITS)), np.trunc(0.5 + weights * (1 << _PRECISION_BITS)))
    matrix = np.zeros((in_size, out_size))
    index = np.minimum(xmin[:, None] + taps[None, :], in_size - 1)
    np.add.at(matrix, (index, np.broadcast_to(np.arange(out_size)[:, None], index.shape)), np.where(taps[None, :] < xmax[:, None], fixed, 0.0))
    return matrix


def pil_resize(images: Tensor, size: tuple[int, int], name: str, order: str | None = None) -> Tensor:
    """uint8 (n, C, H, W) -> uint8 (n, C, h, w) exactly as PIL's `Image.resize(size, filter)` of each image: two
    passes, each skipped when its side keeps its length and each rounded to uint8, in PIL's order for these sizes
    (`order`: "hv" horizontal first, "vh" vertical first; None: `pil_pass_order`'s, and where neither order
    reproduces PIL, PIL itself, image by image on the host). Integer arithmetic in float64 (exact: every partial
    sum stays far below 2^53)."""
    height, width = size
    order = order or pil_pass_order(images.shape[-2], images.shape[-1], height, width, name)
    if order is None:
        resample = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR}[name]
        host = images.permute(0, 2, 3, 1).cpu().numpy()
        out = np.stack([np.array(Image.fromarray(im.squeeze(-1) if im.shape[-1] == 1 else im).resize((width, height), resample)) for im in host])
        return torch.from_numpy(out.reshape(len(host), height, width, -1)).permute(0, 3, 1, 2).to(images.device)
    out = images.to(torch.float64)
    half, shift = float(1 << (_PRECISION_BITS - 1)), float(1 << _PRECISION_BITS)
    for axis in order:
        if axis == "h" and width != out.shape[-1]:
            matrix = torch.from_numpy(pil_coefficients(out.shape[-1], width, name)).to(out.device)
            out = torch.floor((out @ matrix + half) / shift).clamp_(0, 255)
        if axis == "v" and height != out.shape[-2]:
            matrix = torch.from_numpy(pil_coefficients(out.shape[-2], height, name)).to(out.device)
            out = torch.floor((matrix.T @ out + half) / shift).clamp_(0, 255)
    return out.to(torch.uint8)


@functools.lru_cache(maxsize=64)
def pil_pass_order(in_height: int, in_width: int, height: int, width: int, name: str) -> str | None:
    """The order of PIL's two passes for these sizes ("hv" or "vh"), or None when neither reproduces it. PIL
    resamples horizontally first, but recent versions (Pillow 13) sometimes start with the vertical pass when both
    sides change by different factors; so the order is read from PIL itself: a seeded noise image of the input size
    resized by PIL and by both orders (the order depends only on the sizes and the filter). Once per size."""
    if height == in_height or width == in_width:
        return "hv"  # one pass: no order
    probe = np.random.default_rng(0).integers(0, 256, (in_height, in_width, 3), dtype=np.uint8)
    resample = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR}[name]
    expected = torch.from_numpy(np.array(Image.fromarray(probe).resize((width, height), resample))).permute(2, 0, 1)[None]
    tensor = torch.from_numpy(probe).permute(2, 0, 1)[None]
    for order in ("hv", "vh"):
        if torch.equal(pil_resize(tensor, (height, width), name, order), expected):
            return order
    log.warning("PIL's %s resize of %dx%d to %dx%d is reproduced by neither pass order; these images are resized by PIL on the host",
                name, in_height, in_width, height, width)
    return None


def shorter_side_size(height: int, width: int, size: int) -> tuple[int, int]:
    """(h, w) after torchvision's `Resize(size)` with an int size: the shorter side becomes `size`, the longer one
    int(size x long / short)."""
    if width <= height:
        return int(size * height / width), size
    return size, int(size * width / height)


@dataclass(frozen=True)
class PilTransform:
    """A torchvision transform of PIL images (Resize -> CenterCrop -> ToTensor -> Normalize, as open_clip builds
    them) applied to a uint8 batch on its device, with the same pixels (module docstring).

    resize: the side the shorter side becomes (int), or the exact (h, w), or None; interpolation: "bicubic" or
    "bilinear"; crop: the centre crop (h, w) or None; mean, std: per channel, after dividing by 255."""

    resize: int | tuple[int, int] | None
    interpolation: str
    crop: tuple[int, int] | None
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def __call__(self, images: Tensor) -> Tensor:
        """uint8 (n, H, W, 3) -> float32 (n, 3, h, w)."""
        x = images.permute(0, 3, 1, 2)
        height, width = x.shape[-2:]
        if self.resize is not None:
            size = shorter_side_size(height, width, self.resize) if isinstance(self.resize, int) else self.resize
            if tuple(size) != (height, width):
                x = pil_resize(x, size, self.interpolation)
        if self.crop is not None:
            x = centre_crop(x, self.crop)
        mean = torch.tensor(self.mean, dtype=torch.float32, device=x.device)[:, None, None]
        std = torch.tensor(self.std, dtype=torch.float32, device=x.device)[:, None, None]
        return x.to(torch.float32).div(255).sub(mean).div(std)


def centre_crop(images: Tensor, size: tuple[int, int]) -> Tensor:
    """torchvision's `CenterCrop(size)` of (n, C, H, W): zero padding first where the crop is larger (left/top
    half rounded down), then offsets round((H - h) / 2) (Python's rounding, half to even)."""
    crop_h, crop_w = size
    height, width = images.shape[-2:]
    if crop_h > height or crop_w > width:
        pad_w, pad_h = max(crop_w - width, 0), max(crop_h - height, 0)
        images = F.pad(images, (pad_w // 2, (pad_w + 1) // 2, pad_h // 2, (pad_h + 1) // 2), value=0)
        height, width = images.shape[-2:]
    top, left = int(round((height - crop_h) / 2.0)), int(round((width - crop_w) / 2.0))
    return images[..., top : top + crop_h, left : left + crop_w]


def pil_transform_of(transform: Any) -> PilTransform | None:
    """The `PilTransform` of a torchvision `Compose` (open_clip's inference transform), or None when it has a step
    not mirrored here (other interpolations, max_size, another resize mode, other transforms)."""
    from torchvision import transforms as T

    steps = getattr(transform, "transforms", None)
    if steps is None:
        return None
    resize: int | tuple[int, int] | None = None
    interpolation, crop, normalize, to_tensor = "bicubic", None, None, False
    names = {T.InterpolationMode.BICUBIC: "bicubic", T.InterpolationMode.BILINEAR: "bilinear"}
    for step in steps:
        if type(step) is T.Resize and not to_tensor and crop is None and resize is None and step.max_size is None and step.interpolation in names:
            size = [step.size] if isinstance(step.size, int) else list(step.size)
            resize = int(size[0]) if len(size) == 1 else (int(size[0]), int(size[1]))
            interpolation = names[step.interpolation]
        elif type(step) is T.CenterCrop and not to_tensor and crop is None:
            crop = (int(step.size[0]), int(step.size[1]))
        elif isinstance(step, T.ToTensor) and not to_tensor:  # open_clip's MaybeToTensor is one
            to_tensor = True
        elif type(step) is T.Normalize and to_tensor and normalize is None:
            normalize = (tuple(float(v) for v in step.mean), tuple(float(v) for v in step.std))
        elif not to_tensor and (getattr(step, "__name__", "") == "_convert_to_rgb" or
                                (type(step).__name__ == "MaybeConvertMode" and getattr(step, "mode", None) == "RGB")):
            continue  # open_clip's conversion of a PIL image to RGB: the batches are RGB already
        else:
            return None
    if not to_tensor:
        return None
    mean, std = normalize or ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    return PilTransform(resize, interpolation, crop, mean, std)  # type: ignore[arg-type]


class ProcessorOnDevice:
    """A torchvision-backed transformers image processor applied to whole uint8 batches where they are (the
    library's own batched preprocessing, so the pixels are its own)."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor

    def __call__(self, images: Tensor) -> Tensor:
        """uint8 (n, H, W, 3) -> float32 (n, 3, h, w)."""
        return self.processor(images=images.permute(0, 3, 1, 2), return_tensors="pt")["pixel_values"].to(torch.float32)


def processor_on_device(processor: Any) -> ProcessorOnDevice | None:
    """`ProcessorOnDevice` for a torchvision-backed image processor (transformers' default when torchvision is
    installed), else None (a PIL-backed one preprocesses image by image)."""
    return ProcessorOnDevice(processor) if getattr(processor, "backend", None) == "torchvision" else None


def check_pixels(pixels: Tensor, input_size: tuple[int, int] | None = None, name: str = "images") -> None:
    """Raise a clear error unless `pixels` is a non-empty finite float tensor (n, 3, h, w) (with (h, w) = input_size if given)."""
    if not pixels.is_floating_point():
        raise TypeError(f"{name}: expected a float tensor (n, 3, h, w) of preprocessed pixels or a uint8 numpy array (n, H, W, 3), got a {pixels.dtype} tensor")
    if pixels.ndim != 4 or pixels.shape[1] != 3:
        raise ValueError(f"{name}: expected a preprocessed tensor of shape (n, 3, h, w), got {tuple(pixels.shape)}")
    if pixels.shape[0] == 0:
        raise ValueError(f"{name}: expected at least one image, got shape {tuple(pixels.shape)}")
    if input_size is not None and tuple(pixels.shape[2:]) != tuple(input_size):
        raise ValueError(f"{name}: expected preprocessed images of {input_size[0]}x{input_size[1]} pixels, got {pixels.shape[2]}x{pixels.shape[3]}")
    if not torch.isfinite(pixels).all():
        raise ValueError(f"{name}: preprocessed pixels contain NaN or infinite values")


def pixel_batches(images: np.ndarray | Tensor, preprocess: Transform, batch_size: int, input_size: tuple[int, int] | None = None) -> Iterator[Tensor]:
    """Yield float pixel batches (b, 3, h, w) for `images`, in order.

    images: uint8 numpy (n, H, W, 3) -> each image goes through PIL and `preprocess` (one call per image,
    as the DataLoader path does, so both give identical pixels); or a float tensor (n, 3, h, w) that is
    already preprocessed -> sliced as is. input_size: the (h, w) the model needs, checked for tensors.
    """
    check_batch_size(batch_size)
    if isinstance(images, Tensor):
        check_pixels(images, input_size)
        for begin in range(0, images.shape[0], batch_size):
            yield images[begin : begin + batch_size]
        return
    check_images(images)
    for begin in range(0, images.shape[0], batch_size):
        chunk = images[begin : begin + batch_size]
        yield torch.stack([preprocess(Image.fromarray(image)) for image in chunk])


def device_batches(images: np.ndarray, batch_size: int, device: torch.device, preprocess: DevicePreprocess) -> Iterator[Tensor]:
    """Float pixel batches (b, 3, h, w) on `device` from uint8 images (n, H, W, 3): each batch copied there as uint8
    (page-locked and non-blocking to a GPU: a quarter of the bytes of float pixels) and preprocessed there."""
    check_batch_size(batch_size)
    check_images(images)
    for begin in range(0, images.shape[0], batch_size):
        chunk = torch.from_numpy(np.ascontiguousarray(images[begin : begin + batch_size]))
        if device.type == "cuda":
            chunk = chunk.pin_memory()
        yield preprocess(chunk.to(device, non_blocking=True))


def encode_pixels(
    forward: Callable[[Tensor], Tensor],
    images: np.ndarray | Tensor,
    preprocess: Transform,
    batch_size: int,
    device: torch.device,
    input_size: tuple[int, int] | None = None,
    device_preprocess: DevicePreprocess | None = None,
) -> np.ndarray:
    """Run `forward` (pixels (b, 3, h, w) on `device` -> features (b, d)) over `images` -> float32 (n, d), unit rows.

    uint8 images are preprocessed on the device when the encoder has a `device_preprocess` (`device_batches`), else
    image by image (`pixel_batches`); float tensors are taken as preprocessed. Runs under `torch.no_grad()`; on a
    CUDA device the forward pass runs in bfloat16 autocast (mixed precision: about twice the throughput of float32
    on tensor cores, embeddings equal to ~1e-2 relative). Features are L2-normalised in float32 (half-precision
    outputs are upcast first, so the norms are exact to float32 precision) and stay on the device until the last
    batch is queued: the host waits for the device once per call, not per batch.
    """
    out = []
    device = torch.device(device)
    if device_preprocess is not None and isinstance(images, np.ndarray):
        batches = device_batches(images, batch_size, device, device_preprocess)
    else:
        batches = (p.pin_memory() if device.type == "cuda" else p for p in pixel_batches(images, preprocess, batch_size, input_size))
    with torch.no_grad():
        for pixels in batches:
            pixels = pixels.to(device, non_blocking=True)
            if input_size is not None and tuple(pixels.shape[2:]) != tuple(input_size):
                raise ValueError(f"images: preprocessed to {pixels.shape[2]}x{pixels.shape[3]} pixels, the model needs {input_size[0]}x{input_size[1]}")
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
                features = forward(pixels).float()
            out.append(F.normalize(features, dim=-1))
    return torch.cat(out).cpu().numpy().astype(np.float32, copy=False)
