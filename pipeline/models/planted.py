"""Planted-structure benchmark: embeddings that are exactly k-sparse in a hidden rotated basis.

    z = Q^T s + b + noise      (rows: x = s Q + b + eps)

with Q (d, d) Haar-random orthogonal (rows = the true axes), s k-sparse with signed magnitudes
|N(0, 1)| + offset, b a random offset and eps isotropic Gaussian noise. A rotation model that
finds the structure has U = Q up to a signed permutation of rows: `axis_recovery(U, Q)` = 1.
`oracle_fvu` is the FVU of top-k in the true basis, the floor that the noise leaves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from pipeline.metrics.reconstruction import fvu

from pipeline.models.rotations import haar_orthogonal, topk_abs


@dataclass(frozen=True)
class Planted:
    """One planted data set.

    x: (n, d) float32 embeddings; q: (d, d) float64 orthogonal, row i = true axis i;
    s: (n, d) float32 codes in the Q basis, exactly k non-zeros per row; b: (d,) float64 offset.
    """

    x: np.ndarray
    q: np.ndarray
    s: np.ndarray
    b: np.ndarray


def planted(
    n: int,
    d: int,
    k: int,
    noise: float = 0.01,
    seed: int = 0,
    support: Literal["uniform", "zipf"] = "uniform",
    *,
    zipf_exponent: float = 1.0,
    magnitude_offset: float = 0.5,
) -> Planted:
    """Draw n embeddings of dimension d, each k-sparse in a random orthogonal basis.

    support: which k axes a sample uses. "uniform": k distinct axes uniformly at random (all
    axes equally frequent, so every axis has the same variance and PCA cannot tell them apart);
    "zipf": axis i (in a random order) is drawn with weight 1 / (i + 1)^zipf_exponent, without
    replacement (Gumbel top-k), so a few axes are common and most are rare, as concepts are.
    Magnitudes are |N(0, 1)| + magnitude_offset with random signs; the offset keeps every
    active coordinate well above the noise. noise: std of the i.i.d. Gaussian noise per
    coordinate (absolute; the signal has per-sample squared norm about 1.65 k).
    """
    if n < 1 or d < 1:
        raise ValueError(f"planted: need n >= 1 and d >= 1, got n={n}, d={d}")
    if not 1 <= k <= d:
        raise ValueError(f"planted: k={k} must be in 1..d={d}")
    if not noise >= 0:
        raise ValueError(f"planted: noise must be >= 0, got {noise}")
    if support not in ("uniform", "zipf"):
        raise ValueError(f"planted: support must be 'uniform' or 'zipf', got {support!r}")
    if magnitude_offset < 0:
        raise ValueError(f"planted: magnitude_offset must be >= 0, got {magnitude_offset}")
    rng = np.random.default_rng(seed)
    q = haar_orthogonal(d, rng)
    b = rng.standard_normal(d)
    if support == "uniform":
        log_weights = np.zeros(d)
    else:
        log_weights = -zipf_exponent * np.log(np.arange(1, d + 1, dtype=np.float64))[rng.permutation(d)]
    keys = log_weights[None, :] + rng.gumbel(size=(n, d))
    active = np.argpartition(-keys, k - 1, axis=1)[:, :k]
    magnitudes = (np.abs(rng.standard_normal((n, k))) + magnitude_offset) * rng.choice([-1.0, 1.0], size=(n, k))
    s = np.zeros((n, d))
    np.put_along_axis(s, active, magnitudes, axis=1)
    x = s @ q + b + noise * rng.standard_normal((n, d))
    return Planted(x=x.astype(np.float32), q=q, s=s.astype(np.float32), b=b)


def axis_recovery(rotation: np.ndarray | torch.Tensor, q: np.ndarray | torch.Tensor) -> float:
    """Mean over the true axes (rows of q, (m, d)) of the max |cosine| with the learned axes
    (rows of rotation, (r, d)); 1 = every true axis is found (up to sign and order).

    Rows are normalised, so r may differ from m (e.g. an SAE's decoder directions).
    """
    learned = np.asarray(rotation.detach().cpu() if isinstance(rotation, torch.Tensor) else rotation, dtype=np.float64)
    true = np.asarray(q.detach().cpu() if isinstance(q, torch.Tensor) else q, dtype=np.float64)
    if learned.ndim != 2 or true.ndim != 2 or learned.shape[1] != true.shape[1]:
        raise ValueError(f"axis_recovery: expected rotation (r, d) and q (m, d) with the same d, got {learned.shape} and {true.shape}")
    if not (np.isfinite(learned).all() and np.isfinite(true).all()):
        raise ValueError("axis_recovery: rotation or q contains NaN or infinite values")
    learned = learned / np.maximum(np.linalg.norm(learned, axis=1, keepdims=True), 1e-300)
    true = true / np.maximum(np.linalg.norm(true, axis=1, keepdims=True), 1e-300)
    return float(np.abs(true @ learned.T).max(axis=1).mean())


def oracle_fvu(data: Planted, k: int) -> float:
    """FVU of top-k in the true basis Q with the true offset b: the noise floor at that k."""
    z = torch.as_tensor((data.x - data.b) @ data.q.T)
    x_hat = topk_abs(z, k).numpy() @ data.q + data.b
    return fvu(data.x, x_hat)
