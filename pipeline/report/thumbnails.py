"""Images inlined in the report as PNG data URIs (the page must render from file:// with no network)."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image


def png_data_uri(image: np.ndarray, size: int = 96) -> str:
    """A uint8 (H, W, 3) image, resized to `size` px (nearest, so small renders stay crisp), as a data URI."""
    picture = Image.fromarray(np.asarray(image, dtype=np.uint8))
    if picture.size != (size, size):
        picture = picture.resize((size, size), Image.NEAREST)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
