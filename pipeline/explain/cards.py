"""What a latent's card in the report shows beyond its names (pure: arrays in, JSON-able values out).

The feature dashboards researchers read (a latent's top images with their activations, its activation histogram, the
attribute it matches) need numbers only the evaluate stage has, the codes of the test images. These functions turn the
kept latents' codes into those numbers, once per run, for explain.json:

- `activation_stats`: each kept latent's activation on its top images and a histogram of its non-zero activations;
- `best_attributes`: per kept latent, the annotated attribute whose labels its binarised activation matches best (F1 on
  the test images of one kind: the one-to-one matching of one latent);
- `naming_floor`: the cosine that random directions reach with their best vocabulary concept under the same naming as
  the latents (`pipeline.explain.naming.name_latents`): a latent whose best name scores near it is not named by it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import sparse

from pipeline.explain.naming import name_latents
from pipeline.metrics.csr import to_csr

__all__ = ["HISTOGRAM_BINS", "activation_stats", "best_attributes", "naming_floor"]

#: bins of a latent's activation histogram (0 to its largest activation on the test images)
HISTOGRAM_BINS = 24


def activation_stats(codes: Any, latents: np.ndarray, tops: list[list[int]], bins: int = HISTOGRAM_BINS) -> list[dict[str, Any]]:
    """Per latent of `latents`: "top_values" (its activation at each position of `tops`, the rows of `codes` its top
    images are) and "histogram" ({"max": largest activation, "counts": `bins` counts of its non-zero activations over
    equal bins of [0, max]}).

    codes: (n, L) non-negative activations, dense or sparse. latents: int (S,). tops: S lists of row positions."""
    x = to_csr("codes", codes, allow_empty=True)
    latents = np.asarray(latents, dtype=np.int64)
    if len(tops) != len(latents):
        raise ValueError(f"tops: expected {len(latents)} lists (one per latent), got {len(tops)}")
    if not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins: expected an int >= 1, got {bins!r}")
    dense = x[:, latents].toarray().astype(np.float64)  # (n, S): the kept latents only (a few dozen columns)
    top = dense.max(axis=0) if len(dense) else np.zeros(len(latents))
    active = dense > 0
    index = np.minimum((dense / np.where(top > 0, top, 1.0) * bins).astype(np.int64), bins - 1)
    counts = np.zeros((len(latents), bins), np.int64)
    np.add.at(counts, (np.nonzero(active)[1], index[active]), 1)
    out = []
    for j, rows in enumerate(tops):  # a few dozen kept latents: builds the JSON lists
        out.append({"top_values": [float(v) for v in dense[np.asarray(rows, dtype=np.int64), j]],
                    "histogram": {"max": float(top[j]), "counts": counts[j].tolist()}})
    return out


def best_attributes(active: Any, labels: np.ndarray, latents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each latent of `latents`, the attribute (column of `labels`) with the highest F1 of the latent's binarised
    activation against it, and that F1 (ties: the lower column; 0 where the latent or every attribute is never on).

    active: bool (n, L) binarised codes, dense or sparse. labels: bool (n, A). Returns int64 (S,) and float64 (S,)."""
    x = to_csr("active", active, allow_empty=True)
    labels = np.asarray(labels)
    if labels.dtype != np.bool_ or labels.ndim != 2 or labels.shape[0] != x.shape[0]:
        raise ValueError(f"labels: expected bool ({x.shape[0]}, A) (one row per row of active), got {labels.dtype} {labels.shape}")
    latents = np.asarray(latents, dtype=np.int64)
    chosen = sparse.csc_array(x[:, latents]).astype(np.float64)  # (n, S)
    tp = np.asarray(chosen.T @ labels.astype(np.float64))  # (S, A)
    fired = np.diff(chosen.indptr)[:, None]  # each latent's active rows
    positives = labels.sum(axis=0)[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        f1 = np.where(fired + positives > 0, 2 * tp / (fired + positives), 0.0)
    best = np.argmax(f1, axis=1) if f1.shape[1] else np.zeros(len(latents), np.int64)
    score = f1[np.arange(len(latents)), best] if f1.shape[1] else np.zeros(len(latents))
    return best.astype(np.int64), score.astype(np.float64)


def naming_floor(concept_embeddings: np.ndarray, concepts: list[str], text_mean: np.ndarray, n: int = 1000, seed: int = 0) -> dict[str, Any]:
    """The best-concept cosine of `n` random directions (seeded isotropic Gaussian, in the embedding space of
    `concept_embeddings` (C, d)), named as the latents are: {"n", "mean", "p95", "max"} of that cosine."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n: expected an int >= 1, got {n!r}")
    d = np.asarray(concept_embeddings).shape[1]
    directions = np.random.default_rng(seed).standard_normal((n, d))
    best = name_latents(directions, concept_embeddings, list(concepts), top=1, text_mean=text_mean).scores[:, 0].astype(np.float64)
    return {"n": n, "mean": float(best.mean()), "p95": float(np.quantile(best, 0.95)), "max": float(best.max())}
