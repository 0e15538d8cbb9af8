"""Planted-structure data: embeddings that are exactly k-sparse in a hidden rotated basis.

    z = Q^T s + b + noise      (rows: x = s Q + b + eps)

with Q (d, d) Haar-random orthogonal (rows = the true axes), s k-sparse with signed magnitudes
|N(0, 1)| + offset, b a random offset and eps isotropic Gaussian noise. A rotation model that
finds the structure has U = Q up to a signed permutation of rows (`pipeline.metrics.recovery.axis_recovery`
= 1); the benchmark itself is `pipeline.scoring.planted`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np


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
    from scipy.stats import ortho_group  # here: scipy.stats costs ~1 s to import

    q = np.asarray(ortho_group.rvs(d, random_state=rng)).reshape(d, d)  # Haar-random
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
