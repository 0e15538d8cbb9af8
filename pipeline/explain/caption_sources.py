"""Free-form captions: the generative interpretability mode.

A text decoder reads an embedding and writes a caption. CEDAR's claim is that a sparse reconstruction
(k active coordinates in the learned basis) is captioned about as well as the dense embedding, and much
better than a top-k code in the original basis. `caption_sources` produces the three captions side by side
with the embedded decoder (`pipeline.explain.decoder`); `pipeline.explain.blip` does the same with BLIP.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline.explain.decoder import CaptionDecoder, _check_embeddings, decode_captions
from pipeline.models.base import SparseModel
from pipeline.models.rotations import topk_abs


@dataclass
class CaptionSources:
    """Captions of the same images from three inputs: the dense embedding, the model's sparse
    reconstruction at k, and top-k in the original basis (k largest |x - mean| coordinates + mean)."""

    dense: list[str]
    sparse: list[str]
    topk_original: list[str]


def topk_original_basis(x: np.ndarray, mean: np.ndarray, k: int) -> np.ndarray:
    """A sparse code without a rotation: keep the k largest |x - mean| coordinates per row, zero the
    rest, add the mean back. x: (n, d) float; mean: (d,). Returns float32 (n, d)."""
    x = _check_embeddings(x, name="x")
    mean = np.asarray(mean, dtype=np.float32)
    if mean.shape != (x.shape[1],):
        raise ValueError(f"mean: expected shape ({x.shape[1]},), got {mean.shape}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= x.shape[1]:
        raise ValueError(f"k: expected an int in 1..d={x.shape[1]}, got {k!r}")
    centred = torch.as_tensor(x - mean)
    return (topk_abs(centred, int(k)).numpy() + mean).astype(np.float32)


def caption_sources(
    model: SparseModel, x: np.ndarray, k: int, decoder: CaptionDecoder, mean: np.ndarray | None = None, max_len: int = 24
) -> CaptionSources:
    """Captions of x (n, d) from the dense embedding, `model.decode(model.encode(x, k))` (CEDAR, a
    rotation baseline or an SAE at the same K) and top-k in the original basis.

    mean: the centre of the original-basis top-k; None uses the mean of the embeddings the decoder was
    trained on (`decoder.input_mean`; the training mean, like CEDAR's b).
    """
    if not isinstance(model, SparseModel):
        raise TypeError(f"model: expected a SparseModel, got {type(model).__name__}")
    if not isinstance(decoder, CaptionDecoder):
        raise TypeError(f"decoder: expected a CaptionDecoder, got {type(decoder).__name__}")
    x = _check_embeddings(x, decoder.d, name="x")
    if x.shape[1] != model.d:
        raise ValueError(f"x: expected {model.d} columns (the model's d), got shape {x.shape}")
    centre = decoder.input_mean.detach().cpu().numpy() if mean is None else mean
    with torch.no_grad():
        sparse = np.asarray(model.decode(model.encode(x, int(k))), dtype=np.float32)
    return CaptionSources(
        dense=decode_captions(decoder, x, max_len),
        sparse=decode_captions(decoder, sparse, max_len),
        topk_original=decode_captions(decoder, topk_original_basis(x, centre, k), max_len),
    )
