"""The one small interface every image/text encoder implements, and the input checks they share.

Encoders turn uint8 images and strings into L2-normalised float32 embeddings in one shared space
(for CLIP-like models) so that the rest of the pipeline never needs to know which model made them.
"""

from __future__ import annotations

import hashlib
from typing import Protocol, runtime_checkable

import numpy as np
from torch import nn


@runtime_checkable
class Encoder(Protocol):
    """An image (and optionally text) encoder.

    id: provenance string recorded in stores, e.g. "embedded:<first 12 hex of the weights' sha256>".
    dim: embedding dimension d.
    has_text: whether `encode_texts` works (image-only models such as DINOv2 set it False).
    """

    id: str
    dim: int
    has_text: bool

    def encode_images(self, images: np.ndarray, batch_size: int = 256) -> np.ndarray:
        """uint8 (n, H, W, 3) -> float32 (n, d), rows of unit L2 norm."""
        ...

    def encode_texts(self, texts: list[str], batch_size: int = 256) -> np.ndarray:
        """n strings -> float32 (n, d), rows of unit L2 norm."""
        ...


def check_images(images: np.ndarray, image_size: int | None = None, name: str = "images") -> None:
    """Raise a clear error unless `images` is a non-empty uint8 array (n, H, W, 3) (with H = W = image_size if given)."""
    if not isinstance(images, np.ndarray):
        raise TypeError(f"{name}: expected a numpy uint8 array (n, H, W, 3), got {type(images).__name__}")
    if images.dtype != np.uint8:
        raise TypeError(f"{name}: expected dtype uint8 (n, H, W, 3), got {images.dtype}")
    if images.ndim != 4 or images.shape[3] != 3:
        raise ValueError(f"{name}: expected shape (n, H, W, 3), got {images.shape}")
    if images.shape[0] == 0:
        raise ValueError(f"{name}: expected at least one image, got shape {images.shape}")
    if image_size is not None and images.shape[1:3] != (image_size, image_size):
        raise ValueError(f"{name}: expected images of {image_size}x{image_size} pixels, got {images.shape[1]}x{images.shape[2]}")


def check_batch_size(batch_size: int) -> None:
    """Raise ValueError unless batch_size is a positive integer."""
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")


def weights_digest(model: nn.Module) -> str:
    """sha256 (hex) of every parameter and buffer, in name order: the same before saving and after loading."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(str(tuple(tensor.shape)).encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
