"""Rotation models: an orthogonal basis of the embedding space plus a top-k-abs bottleneck.

`RotationModel` is the shared machinery of CEDAR (`pipeline.models.cedar`) and of the
cheap baselines below; the only thing a subclass supplies is its rotation matrix U (d, d),
whose rows are the axes. For a batch of row vectors x (n, d):

    rotate       z~ = (x - b) U^T          (per sample: z~ = U (z - b))
    sparsify     s  = topk_abs(z~, k)      k largest |values| kept with their signs
    reconstruct  x^ = s U + b              (per sample: z^ = U^T s + b)

so at k = d the reconstruction is exact up to float error, and the codes are signed
(`signed = True`; `latents()` gives the 2d half-axis view used by matching and naming).

Baselines ("does the *learned* rotation matter?", docs/science.md §1); nothing is trained,
`fit_init` does all the work:
- `IdentityBasis`  U = I: top-k of z - b in the original coordinates.
- `PCABasis`       U = principal axes of the training sample (descending variance).
- `ICABasis`       FastICA on the PCA-whitened sample, kept orthogonal (see the class).
- `RandomRotation` a Haar-random orthogonal U drawn from the build seed.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pipeline.models.base import SparseModel, array_io
from pipeline.models.options import ICAOptions

log = logging.getLogger(__name__)

#: tolerance of the orthogonality check on a rotation assigned from outside (float32 input).
ORTHOGONALITY_TOL = 1e-4


def topk_abs(z: Tensor, k: int) -> Tensor:
    """Keep the k entries of largest absolute value in each row of z (n, d), signs kept, rest zero.

    Gradients flow to the kept entries only (the selection itself is piecewise constant).
    Ties are broken by `torch.topk` (unspecified but deterministic on one device).
    """
    if k >= z.shape[1]:
        return z
    index = z.abs().topk(k, dim=1, sorted=False).indices
    mask = torch.zeros_like(z, dtype=torch.bool).scatter_(1, index, True)
    return z * mask


def orthogonal_polar_factor(m: np.ndarray) -> np.ndarray:
    """The orthogonal factor R of the polar decomposition m = R H (the orthogonal matrix nearest m)."""
    left, _, right = np.linalg.svd(m)
    return left @ right


def fix_signs(rotation: np.ndarray) -> np.ndarray:
    """Flip each row (axis) so that its largest-magnitude entry is positive: a deterministic
    representative of an axis whose sign an eigen- or ICA solver leaves arbitrary."""
    pivot = np.abs(rotation).argmax(axis=1)
    signs = np.sign(rotation[np.arange(len(rotation)), pivot])
    signs[signs == 0] = 1.0
    return rotation * signs[:, None]


class RotationModel(SparseModel):
    """Base of every rotation-family model (n_latents = d, signed codes).

    Subclasses implement `rotation_matrix()`. Buffers: `b` (d,) the mean training embedding,
    set by `fit_init` (zero before it). Encode/decode/forward/loss live here once.
    """

    signed = True
    trainable = False
    autocast_safe = False  # the orthogonal map and exact invertibility need float32 (`SparseModel.autocast_safe`)

    def __init__(self, d: int, n_latents: int, k: int, **options: Any) -> None:
        if n_latents != d:
            raise ValueError(f"{self.method}: a rotation has n_latents = d; got n_latents={n_latents}, d={d}")
        super().__init__(d, n_latents, k, **options)
        self.register_buffer("b", torch.zeros(d))

    # --- what a subclass provides -----------------------------------------------
    def rotation_matrix(self) -> Tensor:
        """U (d, d), float32, rows = axes, on the model's device. Differentiable where trained."""
        raise NotImplementedError

    # --- helpers -------------------------------------------------------------------
    def resolve_k(self, k: int | None) -> int:
        """`k` or the model's own k, checked to lie in 1..d."""
        if k is None:
            return self.k
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"{self.method}: k must be an int, got {type(k).__name__}")
        if not 1 <= k <= self.d:
            raise ValueError(f"{self.method}: k={k} must be in 1..d={self.d}")
        return int(k)

    def _prepare(self, x: Tensor) -> Tensor:
        """Validate x (n, d) and move it to the model's device (parameter-free models get numpy
        input on the CPU from `array_io`, whatever device their buffers live on)."""
        self.check_input(x)
        return x.to(device=self.b.device, dtype=self.b.dtype)

    def _check_codes(self, codes: Tensor) -> Tensor:
        if codes.ndim != 2 or codes.shape[1] != self.d:
            raise ValueError(f"{self.method}: expected codes of shape (n, {self.d}), got {tuple(codes.shape)}")
        if not torch.isfinite(codes).all():
            raise ValueError(f"{self.method}: codes contain NaN or infinite values")
        return codes.to(device=self.b.device, dtype=self.b.dtype)

    def _rotate(self, x: Tensor, u: Tensor) -> Tensor:
        return (x - self.b) @ u.T

    def _decode(self, codes: Tensor, u: Tensor) -> Tensor:
        return codes @ u + self.b

    def _loss(self, x: Tensor, u: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """(mean over the batch of ||x - x^||_1, codes) with the rotation u computed once by the caller."""
        codes = topk_abs(self._rotate(x, u), k)
        return (x - self._decode(codes, u)).abs().sum(dim=1).mean(), codes

    # --- the SparseModel interface ---------------------------------------------------
    def min_fit_rows(self) -> int:
        """Fewest rows `fit_init` accepts: 1 for a mean; d for bases fitted to the sample (PCA, ICA)."""
        return 1

    def fit_init(self, x: Tensor) -> None:
        """Set `b` to the mean of the training sample x (n, d); subclasses then fit their basis.

        Checks everything first, so a bad sample leaves the model untouched.
        """
        self.check_input(x)
        if len(x) < self.min_fit_rows():
            raise ValueError(f"{self.method}: fit_init needs at least {self.min_fit_rows()} rows (d={self.d}), got {len(x)}")
        with torch.no_grad():
            self.b.copy_(x.to(self.b.device).double().mean(dim=0).float())

    @array_io
    def rotate(self, x: Tensor) -> Tensor:
        """Dense rotated coordinates z~ = (x - b) U^T, (n, d): every axis, before sparsification."""
        x = self._prepare(x)
        return self._rotate(x, self.rotation_matrix())

    @array_io
    def encode(self, x: Tensor, k: int | None = None) -> Tensor:
        """Signed k-sparse codes (n, d): the k largest |coordinates| of (x - b) U^T, signs kept.

        Any k in 1..d works at inference: one rotation serves every sparsity level.
        """
        k = self.resolve_k(k)
        x = self._prepare(x)
        return topk_abs(self._rotate(x, self.rotation_matrix()), k)

    @array_io
    def decode(self, codes: Tensor) -> Tensor:
        """Reconstruction codes U + b, (n, d) in the original space."""
        codes = self._check_codes(codes)
        return self._decode(codes, self.rotation_matrix())

    def forward(self, x: Tensor, k: int | None = None) -> Tensor:
        """Reconstruction (n, d) through the top-k bottleneck, U computed once for both halves."""
        k = self.resolve_k(k)
        x = self._prepare(x)
        u = self.rotation_matrix()
        return self._decode(topk_abs(self._rotate(x, u), k), u)

    def training_loss(self, x: Tensor, progress: float, generator: torch.Generator) -> tuple[Tensor, dict[str, Tensor]]:
        """L1 reconstruction loss at the model's k (a fixed basis has nothing to learn; kept for
        the interface). Stats: l0 (= k), l1."""
        x = self._prepare(x)
        loss, _ = self._loss(x, self.rotation_matrix(), self.k)
        return loss, {"l0": torch.tensor(float(self.k)), "l1": loss.detach()}

    # --- numpy views ------------------------------------------------------------------
    @property
    def rotation(self) -> np.ndarray:
        """U as a float32 numpy array (d, d); row i is axis u_i (+u_i and -u_i are the two half-axes)."""
        with torch.no_grad():
            return self.rotation_matrix().detach().cpu().numpy().astype(np.float32, copy=True)

    @property
    def mean(self) -> np.ndarray:
        """b, the mean training embedding, as a float32 numpy array (d,)."""
        return self.b.detach().cpu().numpy().copy()

    @mean.setter
    def mean(self, value: np.ndarray) -> None:
        array = np.asarray(value, dtype=np.float64)
        if array.shape != (self.d,):
            raise ValueError(f"{self.method}: mean must have shape ({self.d},), got {array.shape}")
        if not np.isfinite(array).all():
            raise ValueError(f"{self.method}: mean contains NaN or infinite values")
        with torch.no_grad():
            self.b.copy_(torch.as_tensor(array, dtype=torch.float32))


class FixedRotation(RotationModel):
    """A rotation held in the buffer `basis` (d, d): the common base of the untrained baselines.

    `rotation` may also be assigned (numpy (d, d), orthogonal to 1e-4), e.g. to evaluate a
    known basis such as the planted one in `pipeline.models.planted`.
    """

    def __init__(self, d: int, n_latents: int, k: int, **options: Any) -> None:
        super().__init__(d, n_latents, k, **options)
        self.register_buffer("basis", torch.eye(d))

    def rotation_matrix(self) -> Tensor:
        return self.basis

    @property
    def rotation(self) -> np.ndarray:  # re-declared so that it gains a setter
        return RotationModel.rotation.fget(self)  # type: ignore[attr-defined]

    @rotation.setter
    def rotation(self, value: np.ndarray) -> None:
        array = np.asarray(value, dtype=np.float64)
        if array.shape != (self.d, self.d):
            raise ValueError(f"{self.method}: rotation must have shape ({self.d}, {self.d}), got {array.shape}")
        if not np.isfinite(array).all():
            raise ValueError(f"{self.method}: rotation contains NaN or infinite values")
        error = float(np.abs(array @ array.T - np.eye(self.d)).max())
        if error > ORTHOGONALITY_TOL:
            raise ValueError(f"{self.method}: rotation must be orthogonal (max |U U^T - I| = {error:.2e} > {ORTHOGONALITY_TOL})")
        with torch.no_grad():
            self.basis.copy_(torch.as_tensor(array, dtype=torch.float32))

    def _centred_sample(self, x: Tensor) -> np.ndarray:
        """float64 numpy copy of x - b, after RotationModel.fit_init set b."""
        return x.detach().cpu().double().numpy() - self.b.detach().cpu().double().numpy()


def principal_axes(centred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(axes (d, d) rows by descending variance with fixed signs, variances (d,)) of centred (n, d)."""
    cov = centred.T @ centred / max(len(centred) - 1, 1)
    variances, vectors = np.linalg.eigh(cov)
    order = np.argsort(variances)[::-1]
    return fix_signs(vectors[:, order].T), np.clip(variances[order], 0.0, None)


class IdentityBasis(FixedRotation):
    """U = I: top-k of z - b in the original coordinates (what a sparse code without a rotation gives)."""

    method = "identity"


class PCABasis(FixedRotation):
    """U = the principal axes of the training sample, rows by descending variance.

    Each axis's sign is fixed so that its largest-magnitude entry is positive (eigen-solvers
    leave it arbitrary). Needs n >= d rows in the `fit_init` sample.
    """

    method = "pca"

    def min_fit_rows(self) -> int:
        return self.d

    def fit_init(self, x: Tensor) -> None:
        super().fit_init(x)
        axes, _ = principal_axes(self._centred_sample(x))
        with torch.no_grad():
            self.basis.copy_(torch.as_tensor(axes, dtype=torch.float32))


class ICABasis(FixedRotation):
    """An orthogonal ICA basis: FastICA on the PCA-whitened sample, without the whitening's scaling.

    What is done exactly (FastICA's own unmixing W K is not orthogonal whenever the variances
    differ): P (r, d) = principal axes with variances lam (r,) above 1e-10 * max; whitened
    sample X_w = (X - b) P^T diag(lam)^-1/2; FastICA (whiten=False) on X_w gives the unmixing W
    (r, r), orthogonal up to convergence; U = polar(W) P, where polar(W) is W's orthogonal
    polar factor (equal to W at convergence). Since W is orthogonal, U is also the orthogonal
    polar factor of the full unmixing W diag(lam)^-1/2 P, i.e. the nearest orthogonal map to
    ICA's. Directions beyond the sample's rank r (possible when n is close to d) are completed
    with the remaining principal axes. Rows are then ordered by descending variance of the
    rotated sample, signs fixed as in PCA. Needs n >= d rows.

    The FastICA random start is drawn from torch's RNG at construction, so `build(..., seed)`
    decides it.
    """

    method = "ica"

    Options = ICAOptions

    def __init__(self, d: int, n_latents: int, k: int, **options: Any) -> None:
        super().__init__(d, n_latents, k, **options)
        self._ica_seed = int(torch.randint(0, 2**31 - 1, (1,)).item())

    def min_fit_rows(self) -> int:
        return self.d

    def fit_init(self, x: Tensor) -> None:
        super().fit_init(x)
        centred = self._centred_sample(x)
        axes, variances = principal_axes(centred)
        rank = int((variances > 1e-10 * max(float(variances[0]), 1e-300)).sum())
        if rank == 0:
            raise ValueError("ica: the fit_init sample has zero variance; cannot fit a basis")
        whitened = centred @ axes[:rank].T / np.sqrt(variances[:rank])
        from sklearn.decomposition import FastICA  # imported here: sklearn costs ~1.3 s, and only ICA needs it
        from sklearn.exceptions import ConvergenceWarning

        opts = self.options
        ica = FastICA(n_components=rank, whiten=False, fun=opts.fun, max_iter=opts.max_iter, tol=opts.tol, random_state=self._ica_seed)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            ica.fit(whitened)
        if any(issubclass(w.category, ConvergenceWarning) for w in caught):
            log.warning("ica: FastICA did not converge in %d iterations (tol %g); using the orthogonal polar factor of its last iterate", opts.max_iter, opts.tol)
        rotation = np.concatenate([orthogonal_polar_factor(ica.components_) @ axes[:rank], axes[rank:]])
        spread = (centred @ rotation.T).var(axis=0)
        rotation = fix_signs(rotation[np.argsort(spread, kind="stable")[::-1]])
        with torch.no_grad():
            self.basis.copy_(torch.as_tensor(rotation, dtype=torch.float32))


class RandomRotation(FixedRotation):
    """U = a Haar-random orthogonal matrix (scipy's `ortho_group`), seeded at construction from torch's RNG (so
    the seed given to `build` decides it; saved as the `basis` buffer). The control for "any rotation"."""

    method = "random_rotation"

    def __init__(self, d: int, n_latents: int, k: int, **options: Any) -> None:
        super().__init__(d, n_latents, k, **options)
        seed = int(torch.randint(0, 2**62, (1,)).item())
        with torch.no_grad():
            from scipy.stats import ortho_group  # here: scipy.stats costs ~1 s to import

            haar = np.asarray(ortho_group.rvs(d, random_state=np.random.default_rng(seed))).reshape(d, d)
            self.basis.copy_(torch.as_tensor(haar, dtype=torch.float32))
