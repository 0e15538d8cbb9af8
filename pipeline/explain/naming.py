"""Concept naming: the concept-based interpretability mode (docs/science.md §1).

Every latent of a sparse model has a direction in the original embedding space:
- rotation models (CEDAR and the rotation baselines) have signed codes; axis i gives two latents,
  the half-axes +u_i and -u_i (u_i = row i of U), in the order of `SparseModel.latents()`: first the
  d "+" half-axes, then the d "-" half-axes. A signed axis is two concepts.
- SAEs: latent i adds (a multiple of) decoder row i to the reconstruction.

A latent is named by the vocabulary concepts whose text embeddings are most cosine-similar to its
direction. Text and image embeddings of CLIP-like models sit in different regions of the space (the
modality gap), so text embeddings are centred by a text mean before the cosine; directions need no
centring (they are differences, not points). An image is then explained by the names of its most
active latents (`explain_images`); the dense embedding's own nearest concepts (`dense_explanations`)
are the reference the sparse explanations are compared with.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from scipy import sparse

from pipeline.metrics.csr import row_of_entries, to_csr
from pipeline.models.base import SparseModel
from pipeline.models.rotations import RotationModel

log = logging.getLogger(__name__)

__all__ = ["LatentNames", "latent_directions", "name_latents", "explain_images", "dense_explanations"]

#: norms below this count as zero when unit-normalising (a zero direction keeps cosine 0 with everything).
_EPS = 1e-12


@dataclass(frozen=True)
class LatentNames:
    """The best concepts of each latent.

    names: str array (L, top), best first. scores: float32 (L, top), the cosine between the latent's
    direction and the (centred) concept embedding. indices: int64 (L, top), the concepts' positions in
    the vocabulary. Ties are broken by the lower vocabulary index.
    """

    names: np.ndarray
    scores: np.ndarray
    indices: np.ndarray

    @property
    def best(self) -> list[str]:
        """The single best name of every latent (L,)."""
        return [str(name) for name in self.names[:, 0]]


# --- checks ------------------------------------------------------------------------------------
def _float_matrix(name: str, value: object, columns: int | None = None) -> np.ndarray:
    """`value` as a finite float64 (n, columns) array, or a one-line error naming `name`."""
    array = np.asarray(value)
    if array.dtype.kind not in "fiu":
        raise TypeError(f"{name}: expected a numeric array, got dtype {array.dtype}")
    if array.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D array (n, d), got shape {array.shape}")
    if columns is not None and array.shape[1] != columns:
        raise ValueError(f"{name}: expected {columns} columns (the embedding dimension), got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name}: contains NaN or infinite values")
    return array.astype(np.float64, copy=False)


def _check_top(top: int, available: int, what: str) -> int:
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)):
        raise TypeError(f"top: expected an int, got {type(top).__name__}")
    if not 1 <= top <= available:
        raise ValueError(f"top: expected 1 <= top <= {available} ({what}), got {top}")
    return int(top)


def _check_concepts(concepts: list[str], n: int) -> list[str]:
    if isinstance(concepts, str) or not isinstance(concepts, (list, tuple)):
        raise TypeError(f"concepts: expected a list of strings, got {type(concepts).__name__}")
    if len(concepts) == 0:
        raise ValueError("concepts: expected at least one concept, got an empty vocabulary")
    if len(concepts) != n:
        raise ValueError(f"concepts: expected {n} names (one per row of concept_embeddings), got {len(concepts)}")
    bad = next((i for i, c in enumerate(concepts) if not isinstance(c, str)), None)
    if bad is not None:
        raise TypeError(f"concepts[{bad}]: expected a string, got {type(concepts[bad]).__name__}")
    return list(concepts)


def _unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm; zero rows stay zero (cosine 0 with everything)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, _EPS)


def _centred_concepts(concept_embeddings: object, concepts: list[str], d: int, text_mean: np.ndarray | None) -> tuple[np.ndarray, list[str]]:
    """Unit rows of (concept embeddings - text_mean) (C, d) and the checked concept names."""
    emb = _float_matrix("concept_embeddings", concept_embeddings, d)
    names = _check_concepts(concepts, emb.shape[0])
    if text_mean is not None:
        mean = np.asarray(text_mean, dtype=np.float64)
        if mean.shape != (d,):
            raise ValueError(f"text_mean: expected shape ({d},), got {mean.shape}")
        if not np.isfinite(mean).all():
            raise ValueError("text_mean: contains NaN or infinite values")
        emb = emb - mean
    return _unit_rows(emb), names


def _top_columns(scores: np.ndarray, top: int) -> np.ndarray:
    """int64 (n, top): per row, the columns of the `top` largest scores, largest first, ties by lower column.

    A stable sort of the negated scores over the whole row: O(C log C) per row, and exact about ties.
    """
    return np.argsort(-scores, axis=1, kind="stable")[:, :top].astype(np.int64)


# --- latent directions -------------------------------------------------------------------------
def latent_directions(model: SparseModel) -> np.ndarray:
    """Unit direction in embedding space of every latent of `model`, float32 (model.n_half_latents, d).

    Rows follow the columns of `model.latents()`:
    - rotation models (signed): rows 0..d-1 are +u_i, rows d..2d-1 are -u_i (u_i = row i of U);
    - SAEs: decoder row i (`W_dec[i]`; the input scaling is one scalar, so it leaves directions alone);
    - any other model: decode(e_i) - decode(0), the change one unit of latent i makes to the
      reconstruction (and its negation for the "-" half of a signed model).
    Zero directions (never the case for the models above) stay zero.
    """
    if not isinstance(model, SparseModel):
        raise TypeError(f"model: expected a SparseModel, got {type(model).__name__}")
    with torch.no_grad():
        if isinstance(model, RotationModel):
            axes = model.rotation.astype(np.float64)
        elif isinstance(getattr(model, "W_dec", None), torch.Tensor) and tuple(model.W_dec.shape) == (model.n_latents, model.d):
            axes = model.W_dec.detach().cpu().double().numpy()
        else:
            probe = np.concatenate([np.zeros((1, model.n_latents)), np.eye(model.n_latents)]).astype(np.float32)
            out = np.asarray(model.decode(probe), dtype=np.float64)
            axes = out[1:] - out[:1]
    if model.signed:
        axes = np.concatenate([axes, -axes])
    if not np.isfinite(axes).all():
        raise ValueError(f"model: latent directions of {model.method or type(model).__name__} contain NaN or infinite values")
    return _unit_rows(axes).astype(np.float32)


# --- naming ------------------------------------------------------------------------------------
def name_latents(
    directions: np.ndarray,
    concept_embeddings: np.ndarray,
    concepts: list[str],
    top: int = 5,
    text_mean: np.ndarray | None = None,
) -> LatentNames:
    """Name each latent by its `top` most cosine-similar concepts.

    directions: (L, d) latent directions (normalised here; `latent_directions` gives them).
    concept_embeddings: (C, d) text embeddings of the vocabulary `concepts` (C names).
    text_mean: (d,) the mean text embedding to subtract before the cosine (the modality gap: CLIP
    text embeddings share a large common component that would otherwise dominate every cosine).
    None compares the raw text embeddings; pass e.g. `concept_embeddings.mean(0)` or the mean over
    a larger caption set to centre. One (L, C) matrix product; float64 inside, float32 scores out.
    """
    dirs = _float_matrix("directions", directions)
    if dirs.shape[0] == 0:
        raise ValueError("directions: expected at least one latent, got an empty array")
    concept_units, names = _centred_concepts(concept_embeddings, concepts, dirs.shape[1], text_mean)
    top = _check_top(top, len(names), "the number of concepts")
    cosine = _unit_rows(dirs) @ concept_units.T
    index = _top_columns(cosine, top)
    scores = np.take_along_axis(cosine, index, axis=1).astype(np.float32)
    return LatentNames(names=np.asarray(names, dtype=object)[index], scores=scores, indices=index)


def explain_images(codes_latents: np.ndarray | sparse.sparray | sparse.spmatrix, names: LatentNames, top: int = 5) -> list[list[tuple[str, float]]]:
    """The concept explanation of each image: its active latents' best names, most active first.

    codes_latents: (n, L) non-negative latent activations (`model.latents(codes)`; a latent is active
    when > 0), dense or scipy.sparse. Returns per image up to `top` (name, activation) pairs over its active latents
    sorted by activation (ties: lower latent index). Two latents with the same best name give one entry
    (the larger activation): an explanation lists concepts, and a repeated concept adds nothing.
    An image with no active latent gets an empty list. Works on the active entries only (one sort of them).
    """
    if not isinstance(names, LatentNames):
        raise TypeError(f"names: expected LatentNames (from name_latents), got {type(names).__name__}")
    codes = to_csr("codes_latents", codes_latents if sparse.issparse(codes_latents) else _float_matrix("codes_latents", codes_latents),
                   dtype=np.float64, allow_empty=True)
    if not np.isfinite(codes.data).all():
        raise ValueError("codes_latents: contains NaN or infinite values")
    n_latents = names.names.shape[0]
    if codes.shape[1] != n_latents:
        raise ValueError(f"codes_latents: expected {n_latents} columns (one per named latent), got shape {codes.shape}")
    if (codes.data < 0).any():
        raise ValueError("codes_latents: expected non-negative activations (use model.latents(codes) for signed codes)")
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 1:
        raise ValueError(f"top: expected an int >= 1, got {top!r}")
    rows = row_of_entries(codes)
    order = np.lexsort((codes.indices, -codes.data, rows))  # by image, then activation down, then latent up
    latents, values = codes.indices[order], codes.data[order]
    best = names.best
    explanations: list[list[tuple[str, float]]] = []
    for start, stop in zip(codes.indptr[:-1], codes.indptr[1:]):  # builds the Python output only
        entries: list[tuple[str, float]] = []
        seen: set[str] = set()
        for latent, value in zip(latents[start:stop], values[start:stop]):
            name = best[latent]
            if name not in seen:
                seen.add(name)
                entries.append((name, float(value)))
                if len(entries) == top:
                    break
        explanations.append(entries)
    return explanations


def dense_explanations(
    embeddings: np.ndarray,
    image_mean: np.ndarray,
    concept_embeddings: np.ndarray,
    concepts: list[str],
    top: int = 5,
    text_mean: np.ndarray | None = None,
) -> list[list[tuple[str, float]]]:
    """The reference explanation: each dense embedding's `top` nearest concepts, (name, cosine), best first.

    Cosine between the centred image embedding x - image_mean (image_mean: (d,), the mean training
    embedding; centring turns the point into a direction comparable to latent directions) and the
    centred concept embeddings (as in `name_latents`). embeddings: (n, d).
    """
    x = _float_matrix("embeddings", embeddings)
    d = x.shape[1]
    mean = np.asarray(image_mean, dtype=np.float64)
    if mean.shape != (d,):
        raise ValueError(f"image_mean: expected shape ({d},), got {mean.shape}")
    if not np.isfinite(mean).all():
        raise ValueError("image_mean: contains NaN or infinite values")
    concept_units, names = _centred_concepts(concept_embeddings, concepts, d, text_mean)
    top = _check_top(top, len(names), "the number of concepts")
    cosine = _unit_rows(x - mean) @ concept_units.T
    index = _top_columns(cosine, top)
    scores = np.take_along_axis(cosine, index, axis=1)
    return [[(names[j], float(s)) for j, s in zip(row_index, row_scores)] for row_index, row_scores in zip(index, scores)]
