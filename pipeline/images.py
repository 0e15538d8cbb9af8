"""Image inputs for the real encoders: image files decoded in DataLoader workers, and in-memory arrays.

Two paths turn images into the float pixel tensors (n, 3, h, w) an encoder's forward pass takes:

- files on disk: `ImageFiles` (a torch Dataset) decodes one file with PIL and applies the encoder's
  `preprocess` (PIL image -> float tensor (3, h, w)); `iter_image_batches` runs it in DataLoader workers
  and yields batches in row order from any start row, so an interrupted extraction resumes from its last
  complete chunk. Unreadable or corrupt files never crash a worker: they come back flagged with a
  reason, and the caller skips them (row ids recorded, so labels stay aligned) or fails.
- arrays in memory: `pixel_batches` turns uint8 (n, H, W, 3) arrays (through PIL and the same
  `preprocess`, so both paths give identical pixels) or already preprocessed float tensors into batches;
  `encode_pixels` runs a forward function over them and returns L2-normalised float32 numpy rows.

Workers are started with the **spawn** context: zarr 3 runs an I/O thread, and forking a process while
that thread holds a lock can deadlock the child. Spawned workers re-import this module, so the dataset
and the transform must be picklable (module-level classes and functions, no lambdas).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset

from pipeline.encoders.base import check_batch_size, check_images

logger = logging.getLogger(__name__)

Transform = Callable[[Image.Image], Tensor]
OnBadImage = Literal["skip", "fail"]
_EMPTY = torch.empty(0)

# What PIL raises for a missing, unreadable, truncated or hostile file (UnidentifiedImageError is an OSError).
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)


class Item(NamedTuple):
    """One decoded image: its row `index`, the pixel tensor (3, h, w) (empty when not `ok`), and why it failed."""

    index: int
    pixels: Tensor
    ok: bool
    reason: str


class BadImage(NamedTuple):
    """An image that could not be decoded: its row index, its path and the decoder's error message."""

    index: int
    path: str
    reason: str


class ImageBatch(NamedTuple):
    """One batch, in row order.

    rows: the row range this batch covers (good and bad images); after it, `rows.stop` rows are done.
    indices: int64 (m,) row indices of the decoded images, aligned with `pixels`' rows.
    pixels: float32 (m, 3, h, w) preprocessed images; an empty tensor when m = 0 (every image bad).
    bad: the images of `rows` that could not be decoded (empty unless some failed).
    """

    rows: range
    indices: np.ndarray
    pixels: Tensor
    bad: list[BadImage]


class BadImageError(ValueError):
    """An image could not be decoded and `on_bad_image` is "fail"."""


def load_rgb(path: str | Path) -> Image.Image:
    """Open and fully decode an image file as RGB (decoding is lazy in PIL; `convert` forces it)."""
    with Image.open(path) as image:
        return image.convert("RGB")


class ImageFiles(Dataset):
    """Image files as a Dataset of `Item(index, pixels, ok, reason)`.

    paths: n image files (any format PIL reads; grey or RGBA images are converted to RGB).
    transform: PIL RGB image -> float tensor (3, h, w), e.g. an encoder's `preprocess`. It must be
    picklable to run in spawned workers. Errors of the transform itself are not caught: they are bugs,
    not bad data.
    """

    def __init__(self, paths: Sequence[str | Path], transform: Transform) -> None:
        if isinstance(paths, (str, Path)) or not isinstance(paths, Sequence):
            raise TypeError(f"paths: expected a sequence of image file paths, got {type(paths).__name__}")
        if not callable(transform):
            raise TypeError(f"transform: expected a callable PIL image -> tensor, got {type(transform).__name__}")
        self.paths = [str(p) for p in paths]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> Item:
        try:
            image = load_rgb(self.paths[index])
        except _DECODE_ERRORS as error:
            return Item(index, _EMPTY, False, f"{type(error).__name__}: {error}")
        pixels = self.transform(image)
        if not isinstance(pixels, Tensor) or pixels.ndim != 3:  # (3, h, w) floats, or (h, w, 3) uint8 (SquareUint8)
            raise TypeError(f"transform: expected a tensor (3, h, w) for {self.paths[index]}, got "
                            f"{tuple(pixels.shape) if isinstance(pixels, Tensor) else type(pixels).__name__}")
        return Item(index, pixels, True, "")


def collate_items(items: list[Item]) -> tuple[Tensor, Tensor, list[tuple[int, str]]]:
    """Items -> (row indices int64 (m,) of the good ones, their pixels stacked (m, 3, h, w), [(index, reason)] of the bad)."""
    good = [item for item in items if item.ok]
    indices = torch.tensor([item.index for item in good], dtype=torch.int64)
    pixels = torch.stack([item.pixels for item in good]) if good else _EMPTY
    return indices, pixels, [(item.index, item.reason) for item in items if not item.ok]


def iter_image_batches(
    paths: Sequence[str | Path],
    transform: Transform,
    batch_size: int,
    num_workers: int,
    start: int = 0,
    on_bad_image: OnBadImage = "skip",
    prefetch_factor: int = 2,
    pin_memory: bool = False,
) -> Iterator[ImageBatch]:
    """Decode `paths[start:]` in DataLoader workers and yield `ImageBatch`es of `batch_size` rows, in row order.

    num_workers: 0 decodes in this process; > 0 starts that many **spawned** workers (never forked).
    start: the first row to decode (0 <= start <= n): resume an interrupted extraction at its last
    complete chunk. Batches cover rows [start, start + b), [start + b, start + 2b), ...
    on_bad_image: "skip" (default) reports undecodable files in `ImageBatch.bad` (and logs a warning) so
    the caller records their row ids; "fail" raises BadImageError at the first one.
    Memory: at most num_workers * prefetch_factor batches wait in the queue, plus the one being used.
    Arguments are checked at the call; decoding starts at the first `next`. Scripts that use workers
    need the usual `if __name__ == "__main__":` guard (spawned workers import the main module).
    """
    dataset = ImageFiles(paths, transform)
    n = len(dataset)
    if n == 0:
        raise ValueError("paths: expected at least one image file, got an empty list")
    check_batch_size(batch_size)
    if not isinstance(num_workers, (int, np.integer)) or num_workers < 0:
        raise ValueError(f"num_workers: expected an integer >= 0, got {num_workers!r}")
    if not isinstance(start, (int, np.integer)) or not 0 <= start <= n:
        raise ValueError(f"start: expected an integer row in [0, {n}], got {start!r}")
    if on_bad_image not in ("skip", "fail"):
        raise ValueError(f"on_bad_image: expected 'skip' or 'fail', got {on_bad_image!r}")
    if not isinstance(prefetch_factor, (int, np.integer)) or prefetch_factor < 1:
        raise ValueError(f"prefetch_factor: expected a positive integer, got {prefetch_factor!r}")
    return _batches(dataset, batch_size, num_workers, start, on_bad_image, prefetch_factor, pin_memory)


def _batches(dataset: ImageFiles, batch_size: int, num_workers: int, start: int, on_bad_image: OnBadImage,
             prefetch_factor: int, pin_memory: bool) -> Iterator[ImageBatch]:
    """The generator behind `iter_image_batches` (separate so that bad arguments raise at the call, not at the first `next`)."""
    n = len(dataset)
    if start == n:
        return
    workers: dict = {}
    if num_workers > 0:
        workers = dict(multiprocessing_context="spawn", prefetch_factor=prefetch_factor, persistent_workers=False)
    loader = DataLoader(
        Subset(dataset, range(start, n)),
        batch_size=batch_size,
        shuffle=False,
        num_workers=num_workers,
        collate_fn=collate_items,
        pin_memory=pin_memory,
        **workers,
    )
    row = start
    for indices, pixels, bad_items in loader:
        rows = range(row, min(row + batch_size, n))
        row = rows.stop
        bad = [BadImage(index, dataset.paths[index], reason) for index, reason in bad_items]
        for item in bad:
            if on_bad_image == "fail":
                raise BadImageError(f"image {item.index} ({item.path}): cannot be decoded ({item.reason}); "
                                    "fix or remove the file, or set on_bad_image: skip to record and skip it")
            logger.warning("skipping image %d (%s): cannot be decoded (%s)", item.index, item.path, item.reason)
        yield ImageBatch(rows, indices.numpy(), pixels, bad)


# --- arrays in memory --------------------------------------------------------------------------


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


def encode_pixels(
    forward: Callable[[Tensor], Tensor],
    images: np.ndarray | Tensor,
    preprocess: Transform,
    batch_size: int,
    device: torch.device,
    input_size: tuple[int, int] | None = None,
) -> np.ndarray:
    """Run `forward` (pixels (b, 3, h, w) on `device` -> features (b, d)) over `images` -> float32 (n, d), unit rows.

    Runs under `torch.no_grad()`; on a CUDA device the forward pass runs in bfloat16 autocast (mixed
    precision: about twice the throughput of float32 on tensor cores, embeddings equal to ~1e-2 relative).
    Features are L2-normalised in float32 (half-precision outputs are upcast first, so the norms are
    exact to float32 precision).
    """
    out = []
    device = torch.device(device)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
        for pixels in pixel_batches(images, preprocess, batch_size, input_size):
            features = forward(pixels.to(device, non_blocking=True)).float()
            out.append(F.normalize(features, dim=-1).cpu().numpy())
    return np.concatenate(out).astype(np.float32, copy=False)


class SquareUint8:
    """Transform for storing images: PIL RGB -> uint8 tensor (size, size, 3), shorter side resized to
    `size` then centre-cropped (the layout of the dataset's images.zarr). Picklable for spawned workers."""

    def __init__(self, size: int) -> None:
        self.size = int(size)

    def __call__(self, image: Image.Image) -> Tensor:
        from PIL import ImageOps

        fitted = ImageOps.fit(image, (self.size, self.size), method=Image.Resampling.BICUBIC)
        return torch.from_numpy(np.asarray(fitted, dtype=np.uint8).copy())
