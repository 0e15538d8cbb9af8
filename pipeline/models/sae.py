"""The sparse-autoencoder base class `SAE` and the sparsifiers its variants share.

The variants live beside it: `pipeline.models.topk` (TopK, BatchTopK, Matryoshka over k and over
dictionary prefixes) and `pipeline.models.penalty` (ReLU and JumpReLU, whose sparsity comes from a penalty
coefficient steered towards a target L0).

What every variant shares (and why)
- Input scaling. The SAE works in a scaled space: `xs = x * input_scale`, where `input_scale`
  (a buffer set by `fit_init`) makes the mean norm of the *centred* training inputs equal to
  sqrt(d). Then the per-element mean squared error is about the batch FVU whatever the
  embedding model, so penalty coefficients and the JumpReLU bandwidth mean the same thing on
  every data set. `decode` divides by the scale again, so outputs are in the original space and
  a checkpoint (the buffer is in the state dict) needs no extra step. Codes live in the scaled
  space (a code of 1 moves the scaled input by one unit-norm atom).
- Dictionary. `W_dec` (n_latents, d): row i is atom i (= column i of the d x n_latents decoder
  matrix of the papers), kept at unit norm: `before_step` removes from each row's gradient its
  component along the row, `after_step` renormalises. `W_enc` (n_latents, d) starts as a copy
  (own storage) of `W_dec`, i.e. the decoder transpose in the papers' convention.
- Decoder bias `b_dec` (d,), scaled space: initialised by `fit_init` to the mean (or the
  geometric median, option `bias_init`) of the scaled sample and subtracted from the input
  before encoding: pre-activations = (xs - b_dec) W_enc^T + b_enc.
- Dead latents: the buffer `steps_since_active` counts, per latent, the training steps
  (calls of `training_loss`) since the latent was last non-zero on a training batch; a latent
  is dead when the count reaches `dead_steps`. Stats report its fraction ("dead_fraction").
- Resampling (options `resample_every`, `resample_until`, `resample_margin`, `resample_refine`,
  `resample_untangle`; see `SAE`): early in training, latents that are dead or explain less than
  the residual's principal directions would are moved onto those directions, refined towards the
  single sparse directions they mix, and the atoms that partly covered them give that part up
  (`resample`). Stats report "resampled" (latents moved this step).
- Reconstruction loss: per-element mean squared error in the scaled space (about the batch FVU).
- Stats of `training_loss`: "l0" (mean active latents per row), "fvu" (this batch), "dead_fraction",
  and each loss term ("mse", and "l1" / "l0_penalty" / "aux" where the variant has one), weighted;
  ReLU and JumpReLU also report "penalty_coef" (the coefficient used on this batch).
- What `k` means. TopK, BatchTopK and MSAE keep k latents per row (BatchTopK: on average). ReLU
  and JumpReLU have no k in their sparsifier; their sparsity comes from a penalty coefficient.
  By default (`target_l0=True`) that coefficient is a buffer `penalty_coef` (saved in
  checkpoints) that a multiplicative controller adapts after every training step so that the
  mean L0 approaches k (`l0_control_step`), the way practitioners tune the penalty to a target
  L0. So every method of the sweep's grid (method x dictionary size x k) lands near mean L0 = k,
  and FVU-vs-K points are comparable across methods (with a fixed coefficient every k of the
  grid trains the same ReLU model, and JumpReLU's L0 drifts to wherever the coefficient puts
  it, whatever k). `target_l0=False` keeps the coefficient fixed at its initial value
  (`l1_coef`, `l0_coef`). The controller needs steps (a few hundred, JumpReLU more than ReLU:
  see the class docstrings), and `pipeline.training.sparse` keeps the epoch of lowest validation FVU,
  which can be an early one whose L0 is still above k: check `val_l0` in the history.
- `encode(x, k=None)`: for the TopK family `k` overrides the model's k at inference; ReLU and
  JumpReLU have no k in their sparsifier and ignore it at inference (it is still range-checked):
  their k acts in training only, as the controller's target.
- Untrained twin (`build` + `fit_init`, never trained) is a sane sparsifier for every variant:
  TopK / MSAE keep k per row; BatchTopK estimates its threshold from the sample (about k active
  per row); JumpReLU sets each latent's threshold to its (1 - k/n_latents) sample quantile (about
  k active per row, no dead latent); ReLU with `target_l0` shifts each latent's encoder bias by
  the same quantile (about k active per row); ReLU with `target_l0=False` keeps a zero bias (about
  half the latents active: the fixed-coefficient ReLU has no k).
"""


from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.models.base import SparseModel, array_io
from pipeline.models.options import SAEOptions

#: rows of the `fit_init` sample used to estimate thresholds (a (rows, n_latents) activation matrix).
THRESHOLD_SAMPLE_ROWS = 4096

# --- sparsifiers and helpers (module level so tests can call them on tiny tensors) ------------
def topk_codes(acts: Tensor, k: int) -> Tensor:
    """Keep the k largest entries of each row of `acts` (n, m), zero the rest (gradient flows to the kept)."""
    values, indices = acts.topk(k, dim=1, sorted=False)
    return torch.zeros_like(acts).scatter(1, indices, values)


def batch_topk_codes(acts: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Keep the k * n largest entries of the whole batch `acts` (n, m); also return the smallest kept
    positive value (a 0-d tensor, NaN when nothing positive was kept) for the inference threshold."""
    flat = acts.reshape(-1)
    values, indices = flat.topk(min(k * acts.shape[0], flat.numel()), sorted=False)
    codes = torch.zeros_like(flat).scatter(0, indices, values).view_as(acts)
    kept = values.detach()
    smallest = torch.where(kept > 0, kept, torch.full_like(kept, math.inf)).min()
    return codes, torch.where(torch.isfinite(smallest), smallest, torch.full_like(smallest, math.nan))



def geometric_median(x: Tensor, iters: int = 100, tol: float = 1e-7) -> Tensor:
    """The point minimising the sum of Euclidean distances to the rows of x (n, d): Weiszfeld's
    iteration from the mean (a loop over iterations, vectorised over rows). Robust to outliers,
    which the mean is not; an optional `b_dec` initialisation."""
    median = x.mean(0)
    for _ in range(iters):
        weights = 1.0 / (x - median).norm(dim=1).clamp_min(1e-12)
        new = (weights[:, None] * x).sum(0) / weights.sum()
        shift = float((new - median).norm())
        median = new
        if shift <= tol * (1.0 + float(median.norm())):
            break
    return median


def column_quantile(pre: Tensor, k: int) -> Tensor:
    """(n_latents,) each column's (1 - k/n_latents) sample quantile of pre (n, n_latents): the value
    exceeded on about k/n_latents of the rows (the round(n k / n_latents)-th largest, at least the largest)."""
    rank = max(1, round(pre.shape[0] * k / pre.shape[1]))
    return pre.topk(min(rank, pre.shape[0]), dim=0).values[-1]


def sq_error(a: Tensor, b: Tensor) -> Tensor:
    """Per-element mean squared error (scalar)."""
    return (a - b).pow(2).mean()


def residual_directions(moment: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
    """The principal directions of a reconstruction residual, as atoms of a non-negative code.

    moment: (d, d) the residual's second moment sum_r e_r e_r^T over recent rows; residual: (b, d) a batch of residuals
    that decides each direction's sign. Returns (directions (d, d), unit rows in decreasing order of eigenvalue, each
    signed so that the batch projects onto it with more energy on the positive side; gains (d,), the energy a
    non-negative code along each direction could take up: its eigenvalue times the positive side's share)."""
    values, vectors = torch.linalg.eigh(moment.double())
    values, vectors = values.flip(0).clamp_min(0), vectors.flip(1).T
    projected = residual.double() @ vectors.T
    positive, negative = projected.clamp(min=0).pow(2).sum(0), projected.clamp(max=0).pow(2).sum(0)
    sign = torch.where(positive >= negative, 1.0, -1.0).to(vectors.dtype)
    share = torch.maximum(positive, negative) / (positive + negative).clamp_min(1e-30)
    return (vectors * sign[:, None]).to(moment.dtype), (values * share).to(moment.dtype)


def sparse_directions(directions: Tensor, residual: Tensor, iters: int) -> Tensor:
    """Refine unit directions (r, d) towards the single sparse directions of a residual (b, d) that they mix.

    When several directions of the data are missing from a dictionary with about equal energy, the residual's second
    moment has a (nearly) degenerate top eigenspace and its eigenvectors are arbitrary mixtures of those directions
    (cosine 0.4-0.7 to each on planted data). A latent placed on a mixture fires on rows of every direction in it and
    competes with the atoms that already cover part of each. But the residual's *rows* are sparse: a row misses one
    or two directions, not a mixture. So each direction v is moved to sum_rows relu(e . v)^3 e (the rows on v's
    positive side, weighted by the cube of their projection: rows aligned with one direction dominate), then the set
    is made orthonormal again (symmetric decorrelation, the polar factor of the (r, d) matrix) so that two latents do
    not collapse onto one direction; `iters` rounds (0: the directions as given). This is FastICA's fixed point with
    a kurtosis contrast, one-sided for a non-negative code. A direction with no row on its positive side keeps its
    previous value. Returns (r, d) unit rows, each at an acute angle to its input where the residual supports it."""
    if iters == 0:
        return directions
    work, rows = directions.double(), residual.double()
    # a row contributes at most |e|^4: below a millionth of the largest, a direction has no row on its positive side
    floor = 1e-6 * float(rows.norm(dim=1).max()) ** 4 if len(rows) else math.inf
    for _ in range(iters):
        moved = (rows @ work.T).clamp(min=0).pow(3).T @ rows
        norms = moved.norm(dim=1, keepdim=True)
        # one scale for all (the polar factor weighs each direction by its support, as FastICA's does)
        moved = torch.where(norms > floor, moved / norms.max().clamp_min(1e-300), work)
        left, _, right = torch.linalg.svd(moved, full_matrices=False)
        work = left @ right
    return work.to(directions.dtype)


def untangled(atoms: Tensor, directions: Tensor, moved: Tensor, threshold: float) -> Tensor:
    """Unit atoms (m, d) with the component along each orthonormal direction (r, d) removed from every atom at a
    cosine above `threshold` to it, except the atoms `moved` (r,) onto those directions; the changed atoms are
    renormalised. A direction that was missing from the dictionary usually lives on as a component of an atom of
    another direction (cosine 0.3-0.5 on planted data); left there, that atom keeps firing on the direction's rows
    and outcompetes the latent just placed on it. threshold 1 changes nothing."""
    cos = atoms @ directions.T
    keep = torch.ones(len(atoms), dtype=torch.bool, device=atoms.device)
    keep[moved] = False
    shared = torch.where((cos > threshold) & keep[:, None], cos, torch.zeros_like(cos))
    changed = shared.any(1)
    result = atoms - shared @ directions
    result[changed] /= result[changed].norm(dim=1, keepdim=True).clamp_min(1e-12)
    return result


def unshared_fraction(atoms: Tensor, usage: Tensor) -> Tensor:
    """(m,) for each unit atom (rows of atoms (m, d)), 1 - its largest squared positive cosine with another atom used
    at least as much (usage (m,)): the share of what it explains that a busier atom could not take over with a
    non-negative code. 0 for the less used of two exact duplicates (the busier one keeps 1), 1 for an atom with no
    busier atom at an acute angle."""
    cos = (atoms @ atoms.T).clamp(min=0) * (usage[None, :] >= usage[:, None])
    cos.fill_diagonal_(0.0)
    return 1.0 - cos.amax(1).pow(2)


def replacements(gains: Tensor, usage: Tensor, margin: float) -> tuple[Tensor, Tensor]:
    """Which latents to move onto which directions: pair the directions by decreasing gain (d,) with the latents by
    increasing usage (m,) (the energy each explained), and keep the leading pairs whose gain exceeds `margin` times
    the usage (a direction must explain clearly more than the latent it replaces; a latent that never fired has usage
    0). Returns (latent indices, direction indices), equally long, possibly empty."""
    by_gain, by_usage = gains.argsort(descending=True, stable=True), usage.argsort(stable=True)
    n = min(len(by_gain), len(by_usage))
    better = gains[by_gain[:n]] > margin * usage[by_usage[:n]]
    count = int(better.to(torch.long).cumprod(0).sum())
    return by_usage[:count], by_gain[:count]



# --- the shared base ---------------------------------------------------------------------------
class SAE(SparseModel):
    """What every SAE variant shares (see the module docstring). Subclasses implement `_sparsify`
    (inference codes from pre-activations at a given k) and `_train_terms` (training codes, scaled
    reconstruction and the named loss terms).

    Options (`SAE.Options`, inherited by every variant's):
    - `bias_init` ("mean"): initial `b_dec`, the mean of the `fit_init` sample, or its geometric
      median (robust when a few embeddings are far off).
    - `dead_steps` (50): a latent that stays zero on this many consecutive training batches is
      dead (AuxK revives dead latents in the TopK family; all report "dead_fraction"). Counted in
      steps, not tokens: at batch 256, 50 steps are 12,800 embeddings, so a live latent with
      frequency above ~1e-3 is practically never flagged, while short runs on small data sets
      (a few hundred steps) still get AuxK's help.
    - `resample_every` (0.05; 0 = never, the published recipes), `resample_until` (0.5),
      `resample_margin` (1): every `resample_every` of training until `resample_until`, move the
      least-used latents onto the principal directions of the residual (`residual_directions`,
      from the second moment of the training residuals since the last resampling, signed for a
      non-negative code) wherever a direction would explain more than `resample_margin` times the
      energy the latent explained since then and no busier atom could have explained instead
      (`replacements`, `unshared_fraction`: a near-duplicate of a busier atom counts for little);
      the chosen directions are first refined towards the single sparse directions of the current
      batch's residual that they mix (`sparse_directions`, option `resample_refine` (20) rounds; 0
      keeps the principal directions: with several directions missing at once, those are arbitrary
      mixtures of them, and BatchTopK's shared budget rarely untangles a latent placed on one:
      planted case at noise 0.01, 38x -> 6x the oracle FVU, median of 3 seeds);
      its atom becomes the direction, and the other atoms at a cosine above `resample_untangle`
      to it lose their component along it (`untangled`: a missing direction lives on as part of
      another direction's atom, which otherwise keeps firing on its rows and pushes the new
      latent back out). `resample_untangle` is 1 (off) by default and 0.2 for BatchTopK and
      JumpReLU, where it was measured to help (planted case, noise 0.01: BatchTopK 6.3x -> 1.2x,
      6 of 6 small cases with every direction against 3 of 6; JumpReLU 9.3x -> 8.2x, and at
      d = 64 3.5x -> 2.2x); TopK finds every direction without it and lost two on one of six
      small cases with it (an early, impure direction projected out of a good atom); its
      encoder row the direction at the mean norm of the other rows, its encoder bias (and
      threshold, JumpReLU) their median (`_reset_latents`); the optimiser's moments are left as
      they are. A dead latent (usage 0) is always moved. Epochs without validation improvement
      count towards early stopping only after `resample_until` (`curriculum_end`).
      Why, and why on by default although no SAE paper's final recipe has it: with a dictionary
      just large enough for the data's directions (planted data: d = 32, 2d signed directions,
      dictionary 2d, k = 4; bench/bench_training_budget.py) every variant ends with a few
      directions missing (55-62 of 64 found), absorbed as small components of two other atoms,
      while a few latents sit idle next to a direction that already has one; each missing
      direction costs about 1/64 of the variance, 45x the oracle FVU at noise 0.01. Those idle
      latents are neither dead (they fire on a few rows per batch, so AuxK and dead-latent
      resampling never touch them) nor near enough to the missing direction for a gradient to
      carry them there. Resampling them by usage against what the residual offers finds every
      direction (64 of 64; TopK 90x -> 1.0x the oracle at noise 0.01). It generalises two
      standard practices: resampling dead latents onto badly reconstructed inputs (Bricken et
      al. 2023, "Towards Monosemanticity") and K-SVD's replacement of rarely used atoms (Aharon,
      Elad & Bruckstein 2006). The report's conventions line names it (`DEVIATIONS`).
    """

    #: the training progress after which nothing is resampled: early stopping waits for it (`SparseModel`)
    @property
    def curriculum_end(self) -> float:  # type: ignore[override]
        return self.options.resample_until if self.options.resample_every > 0 else 0.0

    signed: ClassVar[bool] = False
    trainable: ClassVar[bool] = True

    Options = SAEOptions

    def __init__(self, d: int, n_latents: int, k: int, **options: Any) -> None:
        super().__init__(d, n_latents, k, **options)
        atoms = torch.randn(n_latents, d)
        atoms /= atoms.norm(dim=1, keepdim=True).clamp_min(1e-12)
        self.W_dec = nn.Parameter(atoms)
        self.W_enc = nn.Parameter(atoms.clone())  # a copy: encoder and decoder train separately
        self.b_enc = nn.Parameter(torch.zeros(n_latents))
        self.b_dec = nn.Parameter(torch.zeros(d))
        self.register_buffer("input_scale", torch.ones(()))
        self.register_buffer("steps_since_active", torch.zeros(n_latents, dtype=torch.long))
        # resampling's record since its last round (scaled space): the residual's second moment, each latent's
        # explained energy (sum of squared codes), and the rounds done; buffers, so a resumed run continues exactly
        self.register_buffer("residual_moment", torch.zeros(d, d))
        self.register_buffer("usage", torch.zeros(n_latents))
        self.register_buffer("resample_rounds", torch.zeros((), dtype=torch.long))

    #: buffers that checkpoints written before resampling existed lack: their values at construction are right
    RESAMPLING_BUFFERS = ("residual_moment", "usage", "resample_rounds")

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        for name in self.RESAMPLING_BUFFERS:
            state_dict.setdefault(prefix + name, getattr(self, name).detach().clone())
        super()._load_from_state_dict(state_dict, prefix, *args)

    # --- shapes and checks ---------------------------------------------------------------
    def _resolve_k(self, k: int | None) -> int:
        if k is None:
            return self.k
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"{self.method}: k must be an int, got {type(k).__name__}")
        if not 1 <= k <= self.n_latents:
            raise ValueError(f"{self.method}: k={k} must be in 1..n_latents={self.n_latents}")
        return int(k)

    def pre_activations(self, xs: Tensor) -> Tensor:
        """Scaled inputs (n, d) -> pre-activations (n, n_latents): (xs - b_dec) W_enc^T + b_enc."""
        return F.linear(xs - self.b_dec, self.W_enc, self.b_enc)

    def decode_scaled(self, codes: Tensor) -> Tensor:
        """Codes (n, n_latents) -> reconstruction (n, d) in the scaled space."""
        return codes @ self.W_dec + self.b_dec

    # --- the interface -------------------------------------------------------------------
    @torch.no_grad()
    def fit_init(self, x: Tensor) -> None:
        """From a training sample x (n, d): input scale, b_dec, dead counters reset, thresholds.

        input_scale = sqrt(d) / mean ||x - centre|| (1 when all rows are equal); b_dec = centre *
        input_scale, centre = mean or geometric median. Thresholds (BatchTopK, JumpReLU) are then
        estimated on the pre-activations of at most THRESHOLD_SAMPLE_ROWS rows (only by the methods that have them:
        a TopK SAE skips that product: its untrained twin of 4,096 latents is built in 0.15 s instead of 0.37 s on 2 CPU
        cores).
        """
        self.check_input(x)
        if x.shape[0] == 0:
            raise ValueError(f"{self.method}: fit_init needs at least one row, got an empty sample")
        x = x.to(device=self.W_dec.device, dtype=torch.float32)
        centre = x.mean(0) if self.options.bias_init == "mean" else geometric_median(x)
        spread = float((x - centre).norm(dim=1).mean())
        scale = math.sqrt(self.d) / spread if spread > 0 else 1.0
        self.input_scale.fill_(scale)
        self.b_dec.copy_(centre * scale)
        self.steps_since_active.zero_()
        self.residual_moment.zero_()
        self.usage.zero_()
        self.resample_rounds.zero_()
        self._init_sparsifier(x[:THRESHOLD_SAMPLE_ROWS] * scale)

    def _init_sparsifier(self, xs: Tensor) -> None:
        """Data-dependent sparsifier state from scaled sample rows xs (n, d) (their `pre_activations` where it needs
        them); default none."""

    @array_io
    def encode(self, x: Tensor, k: int | None = None) -> Tensor:
        """(n, d) original-space inputs -> (n, n_latents) non-negative codes (inference sparsifier)."""
        k = self._resolve_k(k)
        self.check_input(x)
        return self._sparsify(self.pre_activations(x * self.input_scale), k)

    @array_io
    def decode(self, codes: Tensor) -> Tensor:
        """(n, n_latents) codes -> (n, d) reconstruction in the original space."""
        if codes.ndim != 2 or codes.shape[1] != self.n_latents:
            raise ValueError(f"{self.method}: expected codes of shape (n, {self.n_latents}), got {tuple(codes.shape)}")
        return self.decode_scaled(codes) / self.input_scale

    def decode_sparse(self, codes: Tensor) -> Tensor:
        """`decode` through a sparse (COO) copy of the codes: the product reads only the decoder rows of the
        non-zeros (k of n_latents per row; for 4,096 latents, k = 32 on one CPU thread: 4.5 ms per 256 rows against
        16.6 ms for the dense product, about what encoding them costs). Codes with more than one non-zero in 8 (an L1
        SAE far from its target) take the dense product, which is faster there."""
        return self.decode(codes.to_sparse() if 8 * int(codes.count_nonzero()) < codes.numel() else codes)

    def _sparsify(self, pre: Tensor, k: int) -> Tensor:
        raise NotImplementedError

    def _train_terms(self, xs: Tensor, pre: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """(training codes (n, m), scaled reconstruction (n, d), named loss terms, already weighted)."""
        raise NotImplementedError

    def dead_mask(self) -> Tensor:
        """(n_latents,) bool: latents inactive for at least `dead_steps` training steps."""
        return self.steps_since_active >= self.options.dead_steps

    def training_loss(self, x: Tensor, progress: float, generator: torch.Generator) -> tuple[Tensor, dict[str, Tensor]]:
        """Loss = sum of the variant's terms on batch x (n, d); updates the dead-latent counters and, while
        resampling is on, resamples first when a round is due (before the forward pass: the weights it changes are
        the ones this step differentiates) and then records the batch's residual and usage."""
        self.check_input(x)
        xs = x * self.input_scale
        resampled = self.resample(xs) if self._resample_due(progress) else 0
        codes, recon, terms = self._train_terms(xs, self.pre_activations(xs))
        loss = torch.stack(list(terms.values())).sum()
        with torch.no_grad():
            active = codes != 0
            self.steps_since_active.add_(1).masked_fill_(active.any(0), 0)
            if self.options.resample_every > 0 and progress < self.options.resample_until:
                residual = (xs - recon).float()
                self.residual_moment.add_(residual.T @ residual)
                self.usage.add_(codes.float().pow(2).sum(0))
            centred = (xs - xs.mean(0)).pow(2).sum().clamp_min(1e-12)
            stats = {
                "l0": active.sum(1).float().mean(),
                "fvu": (xs - recon).pow(2).sum() / centred,
                "dead_fraction": self.dead_mask().float().mean(),
                "resampled": torch.tensor(float(resampled)),
                **{name: term.detach() for name, term in terms.items()},
            }
        return loss, stats

    def _resample_due(self, progress: float) -> bool:
        """Whether a resampling round is due at training `progress`: round r (1, 2, ...) at r * resample_every,
        while progress < resample_until."""
        every = self.options.resample_every
        return every > 0 and progress < self.options.resample_until and progress >= (int(self.resample_rounds) + 1) * every

    @torch.no_grad()
    def resample(self, xs: Tensor) -> int:
        """One resampling round (see the class docstring) on the record since the last round, with the scaled batch
        xs (n, d) deciding the directions' signs; clears the record. Returns how many latents were moved."""
        residual = xs - self.decode_scaled(self._sparsify(self.pre_activations(xs), self.k))
        directions, gains = residual_directions(self.residual_moment, residual)
        latents, chosen = replacements(gains, self.usage * unshared_fraction(self.W_dec, self.usage), self.options.resample_margin)
        if len(latents):
            atoms = sparse_directions(directions[chosen], residual, self.options.resample_refine)
            self._reset_latents(latents, atoms)
            self.W_dec.copy_(untangled(self.W_dec, atoms.to(self.W_dec.dtype), latents, self.options.resample_untangle))
        self.residual_moment.zero_()
        self.usage.zero_()
        self.resample_rounds.add_(1)
        return len(latents)

    def _reset_latents(self, latents: Tensor, atoms: Tensor) -> None:
        """Give `latents` (r,) the unit `atoms` (r, d): decoder rows = atoms, encoder rows = atoms at the mean norm of
        the other encoder rows, encoder biases = the others' median; their dead counters restart. Subclasses reset
        their own per-latent state (JumpReLU: thresholds)."""
        others = torch.ones(self.n_latents, dtype=torch.bool, device=latents.device)
        others[latents] = False
        if not others.any():
            others[:] = True
        self.W_dec[latents] = atoms.to(self.W_dec.dtype)
        self.W_enc[latents] = atoms.to(self.W_enc.dtype) * self.W_enc[others].norm(dim=1).mean()
        self.b_enc[latents] = self.b_enc[others].median()
        self.steps_since_active[latents] = 0

    @torch.no_grad()
    def before_step(self) -> None:
        """Remove from each decoder row's gradient its component along the (unit) row."""
        grad = self.W_dec.grad
        if grad is not None:
            grad -= (grad * self.W_dec).sum(1, keepdim=True) * self.W_dec

    @torch.no_grad()
    def after_step(self) -> None:
        """Renormalise decoder rows to unit norm."""
        self.W_dec /= self.W_dec.norm(dim=1, keepdim=True).clamp_min(1e-12)

