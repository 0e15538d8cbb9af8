"""Image files: decoding (one way for every caller), and batches decoded in DataLoader workers for the data stage.

- `open_rgb(path)` decodes one file to an RGB PIL image: EXIF orientation applied, transparent pixels composited
  onto white (a transparent PNG does not turn black), 16-bit greyscale scaled to 8 bits; large JPEGs can be
  decoded at a reduced scale (`draft`). `square(image, size)` resizes the shorter side to `size` and centre-crops:
  the layout of the dataset's images. `load_image(path, size)` is the two together (what `cedar explain` reads).
- `check_image_files(paths, context)` opens every header up front (fast; loaders call it when a bad image must stop
  the stage before any decoding).
- `iter_image_batches` decodes many files in DataLoader workers and yields batches in row order from any start row,
  so an interrupted decoding resumes from its last complete chunk. Unreadable or corrupt files never crash a
  worker: they come back as `SkippedImage` records, and the caller skips them (row ids recorded, labels stay
  aligned) or fails with `BadImage` (`on_bad_image`).

Workers are started with the **spawn** context: zarr 3 runs an I/O thread, and forking a process while that thread
holds a lock can deadlock the child. Spawned workers re-import this module, so the dataset and the transform must be
picklable (module-level classes and functions, no lambdas).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset

logger = logging.getLogger(__name__)

Transform = Callable[[Image.Image], Tensor]
OnBadImage = Literal["skip", "fail"]
_EMPTY = torch.empty(0)

# What PIL raises for a missing, unreadable, truncated or hostile file (UnidentifiedImageError is an OSError).
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)


class BadImage(ValueError):
    """An image file is missing, unreadable or corrupt. `path` is the file, `reason` says why."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{self.path}: unreadable image ({reason})")


def _check_size(size: object) -> int:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
        raise TypeError(f"size: expected an integer, got {type(size).__name__}")
    if size < 1:
        raise ValueError(f"size: expected an integer >= 1, got {size}")
    return int(size)


def open_rgb(path: str | Path, draft: int | None = None) -> Image.Image:
    """Decode an image file fully as an RGB PIL image (see the module docstring); PIL's errors propagate.

    draft: JPEG only, decode at 1/2..1/8 scale while both sides stay >= draft (much faster for large photos).
    """
    with Image.open(path) as image:
        if draft is not None:
            image.draft("RGB", (draft, draft))
        image = ImageOps.exif_transpose(image)
        image.load()
        if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N"):
            grey = np.asarray(image).astype(np.float64) / 257.0
            image = Image.fromarray(np.clip(np.rint(grey), 0, 255).astype(np.uint8))
        if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
            rgba = image.convert("RGBA")
            image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
        return image.convert("RGB")


def square(image: Image.Image, size: int) -> np.ndarray:
    """uint8 (size, size, 3): the shorter side resized to `size` (bicubic), then the centre crop."""
    width, height = image.size
    if width < 1 or height < 1:
        raise ValueError(f"empty image {width} x {height}")
    scale = size / min(width, height)
    new_size = (max(size, round(width * scale)), max(size, round(height * scale)))
    if new_size != image.size:
        image = image.resize(new_size, Image.Resampling.BICUBIC, reducing_gap=3.0)
    left, top = (new_size[0] - size) // 2, (new_size[1] - size) // 2
    return np.asarray(image.crop((left, top, left + size, top + size)), dtype=np.uint8).copy()


def load_image(path: Path | str, size: int) -> np.ndarray:
    """Read one image file as uint8 (size, size, 3) RGB (`open_rgb` with a JPEG draft, then `square`).

    Raises BadImage(path, reason) if the file is missing, not an image, truncated or otherwise corrupt.
    """
    size = _check_size(size)
    path = Path(path)
    if not path.is_file():
        raise BadImage(path, "file not found")
    try:
        return square(open_rgb(path, draft=size), size)
    except _DECODE_ERRORS as error:
        raise BadImage(path, f"{type(error).__name__}: {error}") from None


def load_images(paths: Sequence[Path | str], size: int) -> np.ndarray:
    """Read several image files with `load_image`: uint8 (n, size, size, 3). Raises BadImage on the first bad one."""
    size = _check_size(size)
    out = np.empty((len(paths), size, size, 3), dtype=np.uint8)
    for i, path in enumerate(paths):
        out[i] = load_image(path, size)
    return out


def check_image_files(paths: Sequence[Path], context: str) -> None:
    """Open every file's header (no pixel decoding) and raise BadImage for the first that is missing or not an image.

    context: where the paths came from, for the message ("listed in images.txt"). Cost: one file open per
    image (about 0.1 ms on a local disk); truncated pixel data is only found when the pixels are decoded.
    """
    for path in paths:
        if not path.is_file():
            raise BadImage(path, f"file not found ({context})")
        try:
            with Image.open(path) as image:
                width, height = image.size
        except _DECODE_ERRORS as error:
            raise BadImage(path, f"{type(error).__name__}: {error} ({context})") from None
        if width < 1 or height < 1:
            raise BadImage(path, f"empty image {width} x {height} ({context})")


class SquareUint8:
    """Transform for storing images: PIL RGB -> uint8 tensor (size, size, 3) by `square` (the layout of the
    dataset's images.zarr). Picklable for spawned workers."""

    def __init__(self, size: int) -> None:
        self.size = _check_size(size)

    def __call__(self, image: Image.Image) -> Tensor:
        return torch.from_numpy(square(image, self.size))


# --- many files, in DataLoader workers ---------------------------------------------------------


class Item(NamedTuple):
    """One decoded image: its row `index`, the pixel tensor (3, h, w) (empty when not `ok`), and why it failed."""

    index: int
    pixels: Tensor
    ok: bool
    reason: str


class SkippedImage(NamedTuple):
    """An image that could not be decoded: its row index, its path and the decoder's error message."""

    index: int
    path: str
    reason: str


class ImageBatch(NamedTuple):
    """One batch, in row order.

    rows: the row range this batch covers (good and bad images); after it, `rows.stop` rows are done.
    indices: int64 (m,) row indices of the decoded images, aligned with `pixels`' rows.
    pixels: the transformed images stacked (m, ...); an empty tensor when m = 0 (every image bad).
    bad: the images of `rows` that could not be decoded (empty unless some failed).
    """

    rows: range
    indices: np.ndarray
    pixels: Tensor
    bad: list[SkippedImage]


class ImageFiles(Dataset):
    """Image files as a Dataset of `Item(index, pixels, ok, reason)`.

    paths: n image files (any format PIL reads; decoded by `open_rgb`). transform: PIL RGB image -> tensor, e.g.
    `SquareUint8` (uint8 (S, S, 3)) or an encoder's `preprocess` (float (3, h, w)). It must be picklable to run in
    spawned workers. Errors of the transform itself are not caught: they are bugs, not bad data. draft: see
    `open_rgb`.
    """

    def __init__(self, paths: Sequence[str | Path], transform: Transform, draft: int | None = None) -> None:
        if isinstance(paths, (str, Path)) or not isinstance(paths, Sequence):
            raise TypeError(f"paths: expected a sequence of image file paths, got {type(paths).__name__}")
        if not callable(transform):
            raise TypeError(f"transform: expected a callable PIL image -> tensor, got {type(transform).__name__}")
        self.paths = [str(p) for p in paths]
        self.transform = transform
        self.draft = draft

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> Item:
        try:
            image = open_rgb(self.paths[index], self.draft)
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
    draft: int | None = None,
) -> Iterator[ImageBatch]:
    """Decode `paths[start:]` in DataLoader workers and yield `ImageBatch`es of `batch_size` rows, in row order.

    num_workers: 0 decodes in this process; > 0 starts that many **spawned** workers (never forked).
    start: the first row to decode (0 <= start <= n): resume an interrupted extraction at its last
    complete chunk. Batches cover rows [start, start + b), [start + b, start + 2b), ...
    on_bad_image: "skip" (default) reports undecodable files in `ImageBatch.bad` (and logs a warning) so
    the caller records their row ids; "fail" raises BadImage at the first one.
    Memory: at most num_workers * prefetch_factor batches wait in the queue, plus the one being used.
    Arguments are checked at the call; decoding starts at the first `next`. Scripts that use workers
    need the usual `if __name__ == "__main__":` guard (spawned workers import the main module).
    """
    dataset = ImageFiles(paths, transform, draft)
    n = len(dataset)
    if n == 0:
        raise ValueError("paths: expected at least one image file, got an empty list")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
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
        bad = [SkippedImage(index, dataset.paths[index], reason) for index, reason in bad_items]
        for item in bad:
            if on_bad_image == "fail":
                raise BadImage(item.path, f"{item.reason}; image {item.index} of the list: fix or remove the file, "
                               "or set on_bad_image: skip to record and skip it")
            logger.warning("skipping image %d (%s): cannot be decoded (%s)", item.index, item.path, item.reason)
        yield ImageBatch(rows, indices.numpy(), pixels, bad)
