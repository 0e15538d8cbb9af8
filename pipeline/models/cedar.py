"""CEDAR: a learned rotation of the embedding space with a top-k bottleneck (docs/science.md §1).

    U  = orth(A)                    A (d, d) the only learnable parameter; orth = matrix_exp(A - A^T)
    z~ = (z - b) U^T                b = mean training embedding (buffer set by fit_init)
    s  = topk_abs(z~, k)            signed k-sparse code
    z^ = s U + b                    loss = mean over the batch of ||z - z^||_1

Encode/decode are shared with the rotation baselines (`pipeline.models.rotations.RotationModel`);
this module adds the learnable orthogonal map, the dense-to-sparse curriculum and random k.
U is computed once per forward / training step from A, never per sample.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from pipeline.models.options import CedarOptions, CurriculumShape, RandomK
from pipeline.models.rotations import RotationModel, principal_axes, topk_abs


# --- orthogonal maps of an unconstrained (d, d) matrix ---------------------------------------
def expm_rotation(a: Tensor) -> Tensor:
    """matrix_exp(A - A^T): exactly orthogonal (exp of a skew matrix), covers all of SO(d), A = 0 -> I."""
    return torch.linalg.matrix_exp(a - a.T)


def cayley_rotation(a: Tensor) -> Tensor:
    """Cayley map of S = A - A^T: (I - S)^-1 (I + S) = 2 (I - S)^-1 - I (one inverse, no exp).

    Orthogonal for every skew S (I - S is always invertible), A = 0 -> I. It cannot reach
    rotations with eigenvalue -1 (a half-turn in some plane); a half-turn only flips the signs
    of two axes, which signed codes do not care about.
    """
    eye = torch.eye(a.shape[0], dtype=a.dtype, device=a.device)
    return 2.0 * torch.linalg.inv(eye - (a - a.T)) - eye


def householder_rotation(a: Tensor) -> Tensor:
    """-(H_1 H_2 ... H_d) with H_i = I - 2 v_i v_i^T / ||v_i||^2 and V = strict_lower(A) + I.

    The product is formed in one block (no loop over reflectors) by the UT transform:
    H_1 ... H_d = I - V T^-1 V^T with T = strict_upper(V^T V) + diag(V^T V) / 2, so it costs a
    Gram matrix, one triangular solve and one matmul. The leading minus makes A = 0 give I
    (V = I gives H_1 ... H_d = -I); the result is a product of orthogonal matrices, hence
    exactly orthogonal, and represents every rotation up to the signs of its axes.
    """
    d = a.shape[0]
    eye = torch.eye(d, dtype=a.dtype, device=a.device)
    v = torch.tril(a, diagonal=-1) + eye
    gram = v.T @ v
    t = torch.triu(gram, diagonal=1) + torch.diag(torch.diagonal(gram) / 2.0)
    return v @ torch.linalg.solve_triangular(t, v.T, upper=True) - eye


ORTHOGONAL_MAPS = {"expm": expm_rotation, "cayley": cayley_rotation, "householder": householder_rotation}


# --- training schedule ----------------------------------------------------------------------
def curriculum_k(progress: float, k: int, k_start: int, frac: float, shape: CurriculumShape) -> int:
    """The k of the dense-to-sparse curriculum at `progress` in [0, 1].

    k goes from k_start (at progress 0) to k (at progress >= frac), then stays at k.
    linear: straight line; cosine: half-cosine (slow start and end); exponential: geometric
    interpolation k_start * (k / k_start)^t, i.e. the same number of steps per halving of k,
    so small k (where the loss has signal) gets as much time as large k. Rounded to an int.
    """
    t = 1.0 if frac <= 0 else min(max(progress, 0.0) / frac, 1.0)
    if shape == "linear":
        value = k_start + (k - k_start) * t
    elif shape == "cosine":
        value = k + (k_start - k) * 0.5 * (1.0 + math.cos(math.pi * t))
    elif shape == "exponential":
        value = k_start * (k / k_start) ** t
    else:
        raise ValueError(f"cedar: curriculum_shape must be linear, cosine or exponential, got {shape!r}")
    return int(min(max(round(value), k), k_start))


def random_k_bounds(k_current: int, k_min: float) -> tuple[int, int]:
    """(low, high) of the random k: high = k_current; low = round(k_min * k_current) when
    0 < k_min < 1 (a fraction), else round(k_min) (an absolute number), clipped to 1..high."""
    low = k_min * k_current if k_min < 1 else k_min
    return max(1, min(int(round(low)), k_current)), k_current


def sample_k(k_current: int, mode: RandomK, k_min: float, generator: torch.Generator) -> int:
    """One k per batch between `random_k_bounds(k_current, k_min)`, inclusive.

    uniform: every integer equally likely; loguniform: log k uniform (each halving of k equally
    likely, so small k are visited as often as large ones). "none" returns k_current.
    """
    if mode == "none":
        return k_current
    low, high = random_k_bounds(k_current, k_min)
    if low == high:
        return high
    u = float(torch.rand(1, generator=generator, device=generator.device).item())
    if mode == "uniform":
        value = low + math.floor(u * (high - low + 1))
    elif mode == "loguniform":
        value = math.floor(math.exp(math.log(low) + u * (math.log(high + 1) - math.log(low))))
    else:
        raise ValueError(f"cedar: random_k must be none, uniform or loguniform, got {mode!r}")
    return int(min(max(value, low), high))


class Cedar(RotationModel):
    """CEDAR: learned rotation U = orth(A) with a top-k-abs bottleneck; signed codes, n_latents = d.

    Options (`Cedar.Options`; all have defaults):
    - `parametrization` ("expm"): the orthogonal map A -> U. "expm" = matrix_exp(A - A^T), the
      paper's map, exact and complete but O(d^3) with an expensive backward (torch
      differentiates it through a 2d x 2d matrix_exp). "cayley" and "householder" are exactly
      orthogonal too and about 13x / 9x cheaper. The map's cost is fixed per step while a
      TopK step grows with the batch, so the batch decides the ratio: training step against a
      TopK SAE step of dictionary d, d = 512, one CPU core (bench/bench_cedar_step.py), at
      batch 256 / 1024 / 4096: expm 19.4x / 6.4x / 2.2x, cayley 2.2x / 1.2x / 0.9x,
      householder 2.9x / 1.4x / 1.0x. For large d on CPU prefer cayley with batches >= 1024.
    - `init` ("pca", our choice: the paper does not say): "pca" = U = orth(A) B with B the principal axes of
      the `fit_init` sample (a fixed buffer) and A = 0, so training starts at the PCA baseline and learns a
      rotation away from it. Measured with bench/bench_cedar_bases.py: on planted data (d 32) it keeps CEDAR's
      FVU-vs-K curve at or below PCA's over every K it was trained for at k/d = 1/8 and 3/8 (from U = I it sits on
      a plateau at 3/8); on the default run's embeddings (d 128) at k = 8 both starts end below PCA (K = 8: 0.163
      from PCA, 0.160 from U = I, PCA 0.213), but at k = 32 no schedule we tried stays at or below PCA on the whole
      trained range: from PCA, K = 16 / 32 give 0.0594 / 0.0095 against PCA's 0.0589 / 0.0090 (1-5 % above), from
      U = I 0.0596 / 0.0101, with the L2 loss 0.0584 / 0.0093. The untrained twin is the PCA basis itself.
      "identity": A = 0 so U = I (training starts from the original coordinates).
      "random" = A with i.i.d. N(0, init_scale^2 / d) entries, drawn from torch's RNG (seeded
      by `build`). On the planted benchmark (d = 64) identity gives the lower FVU when
      k/d <= 1/4, but for denser codes (k/d = 3/8) U = I sits on a plateau it never leaves
      (axis recovery 0.34) while "random" escapes it (0.99); see bench/bench_planted.py.
    - `init_scale` (0.8): size of the random init, scaled by 1/sqrt(d) so that the initial
      rotation angles (about 2.8 * init_scale radians at most) do not depend on d; 0.8 is
      the value that escaped the plateau above.
    - `loss` ("l1", the paper's): mean over the batch of ||z - z^||_1. "l2": the squared error, the
      objective FVU measures (an option: the FVU-vs-K comparison with PCA, bench/bench_cedar_bases.py).
    - `k_start` (0 = d): k at the start of the dense-to-sparse curriculum. Top-k is not
      smooth and training from the sparse end trains badly (docs/science.md §1), so the default starts
      fully dense. Must be 0 or in k..d.
    - `curriculum_frac` (0.5): fraction of training over which k goes from k_start to k;
      the second half trains at the target. 0 disables the curriculum.
    - `curriculum_shape` ("exponential"): linear, cosine or exponential (geometric) decay;
      geometric gives each halving of k equal time, which matters when k << d.
    - `random_k` ("uniform"): per-batch random k between a lower bound and the current
      curriculum value, so one rotation serves many k at inference. "none" trains at the
      curriculum value only; "loguniform" favours small k.
    - `random_k_min` (0.5): the lower bound; in (0, 1) a fraction of the current curriculum
      value, >= 1 an absolute k. 0.5 covers an octave below the target, where evaluation
      sweeps K, while the target k itself keeps most of the weight of training. For dense
      codes (k/d >= 3/8 on the planted benchmark) "loguniform" with random_k_min = 2 also
      lets U = I escape its plateau (recovery 0.998 at k/d = 3/8), at some FVU cost at k.
    """

    method = "cedar"
    trainable = True

    Options = CedarOptions

    def __init__(self, d: int, n_latents: int, k: int, **options: Any) -> None:
        super().__init__(d, n_latents, k, **options)
        opts = self.options
        if not (opts.k_start == 0 or k <= opts.k_start <= d):
            raise ValueError(f"cedar: k_start must be 0 (= d) or in k..d = {k}..{d}, got {opts.k_start}")
        self.A = nn.Parameter(torch.zeros(d, d))
        self.register_buffer("base", torch.eye(d))  # B of U = orth(A) B: the identity, or PCA's axes (init "pca")
        if opts.init == "random":
            with torch.no_grad():
                self.A.normal_(0.0, opts.init_scale / math.sqrt(d))
        self._cache: tuple[tuple[Any, ...], Tensor] | None = None

    # --- the rotation -----------------------------------------------------------------
    def rotation_matrix(self) -> Tensor:
        """U = orth(A) B (d, d), rows = axes; B is the identity unless the model was initialised at PCA.

        With gradients enabled it is recomputed on every call (callers compute it once per
        step). Without gradients (inference) it is cached until A or B changes: the key is their
        in-place version counters and storage, which optimiser steps, `load_state_dict` and
        `.to()` all change. (Writing through `A.data` bypasses the counter; don't.)
        """
        if torch.is_grad_enabled():
            return ORTHOGONAL_MAPS[self.options.parametrization](self.A) @ self.base
        key = (self.A._version, self.A.data_ptr(), self.base._version, self.base.data_ptr(), self.A.device, self.A.dtype)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, (ORTHOGONAL_MAPS[self.options.parametrization](self.A) @ self.base).detach())
        return self._cache[1]

    def fit_init(self, x: Tensor) -> None:
        """b = the sample mean; with init "pca" also B = the sample's principal axes (signs fixed). A sample of fewer
        than d rows still gives d orthonormal axes (the covariance's eigenvectors): those beyond its rank span the
        rest of the space in an arbitrary orthonormal basis, which training then rotates like any other start."""
        super().fit_init(x)
        if self.options.init == "pca":
            centred = x.detach().cpu().double().numpy() - self.b.detach().cpu().double().numpy()
            with torch.no_grad():
                self.base.copy_(torch.as_tensor(principal_axes(centred)[0], dtype=self.base.dtype))

    def train(self, mode: bool = True) -> "Cedar":
        self._cache = None
        return super().train(mode)

    # --- training ----------------------------------------------------------------------
    @property
    def k_begin(self) -> int:
        """The curriculum's starting k (k_start, with 0 meaning d)."""
        return self.options.k_start or self.d

    @property
    def curriculum_end(self) -> float:  # type: ignore[override]
        """Training progress at which k reaches its target. Validation FVU at the target k says
        little before that, so early stopping should not count epochs before it."""
        return self.options.curriculum_frac

    def curriculum_k(self, progress: float) -> int:
        """The curriculum value of k at `progress` in [0, 1] (see `curriculum_k`)."""
        return curriculum_k(progress, self.k, self.k_begin, self.options.curriculum_frac, self.options.curriculum_shape)

    def training_loss(self, x: Tensor, progress: float, generator: torch.Generator) -> tuple[Tensor, dict[str, Tensor]]:
        """Mean reconstruction loss (L1, or squared error with loss "l2") at this batch's k; U computed once.

        Stats: l0 (the batch's k = the exact number of active coordinates), k_curriculum, and the loss's name.
        """
        x = self._prepare(x)
        k_current = self.curriculum_k(progress)
        k = sample_k(k_current, self.options.random_k, self.options.random_k_min, generator)
        u = self.rotation_matrix()
        if self.options.loss == "l1":
            loss, _ = self._loss(x, u, k)
        else:
            loss = (x - self._decode(topk_abs(self._rotate(x, u), k), u)).pow(2).sum(dim=1).mean()
        return loss, {"l0": torch.tensor(float(k)), "k_curriculum": torch.tensor(float(k_current)), self.options.loss: loss.detach()}

