"""Sparse autoencoders (SPEC section D): ReLU, TopK, BatchTopK, JumpReLU, Matryoshka (MSAE) and
prefix-Matryoshka, all sharing one base class `SAE`.

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
  see the class docstrings), and `pipeline.train` keeps the epoch of lowest validation FVU,
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

import inspect
import math
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.models.base import SparseModel, array_io

BiasInit = Literal["mean", "geometric_median"]

#: rows of the `fit_init` sample used to estimate thresholds (a (rows, n_latents) activation matrix).
THRESHOLD_SAMPLE_ROWS = 4096

#: the adaptive penalty coefficient (ReLU, JumpReLU with `target_l0`) stays within this factor of
#: its initial value, both ways: no runaway to 0 (from which a multiplicative update never returns)
#: or to infinity when the target L0 cannot be reached.
PENALTY_COEF_RANGE = 1e4


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


def l0_control_step(coef: Tensor, l0: Tensor, k: int, rate: float, low: float, high: float) -> Tensor:
    """One step of the L0 controller: coef * exp(rate * e), e = clip(l0 / k - 1, -1, 1), clamped to
    [low, high]. Raises the penalty when the batch's mean L0 is above the target k, lowers it when
    below; the clip bounds one step's change to a factor exp(+-rate) (e >= -1 anyway), so a large
    initial L0 (an untrained ReLU SAE fires on about half its latents) cannot blow the coefficient
    up faster than the model can respond. No gradient: a plain function of detached values."""
    error = (l0.detach().to(coef.dtype) / k - 1.0).clamp(-1.0, 1.0)
    return (coef * torch.exp(rate * error)).clamp(low, high)


def rectangle(u: Tensor) -> Tensor:
    """The rectangle kernel K(u) = 1 for |u| < 1/2, else 0 (JumpReLU's pseudo-derivative kernel)."""
    return ((u > -0.5) & (u < 0.5)).to(u.dtype)


class JumpReLUFunction(torch.autograd.Function):
    """y = z * H(z - theta), with the straight-through pseudo-derivatives of Rajamanoharan et al. (2024).

    dy/dz = H(z - theta) (the true derivative); dy/dtheta = -(theta / eps) K((z - theta) / eps), the
    rectangle-kernel estimate of the jump's effect (the true derivative is 0 almost everywhere).
    z: (n, m); theta: (m,) positive; eps: the kernel bandwidth.
    """

    @staticmethod
    def forward(ctx: Any, z: Tensor, theta: Tensor, bandwidth: float) -> Tensor:
        ctx.save_for_backward(z, theta)
        ctx.bandwidth = bandwidth
        return z * (z > theta).to(z.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        z, theta = ctx.saved_tensors
        eps = ctx.bandwidth
        grad_z = grad * (z > theta).to(z.dtype)
        grad_theta = (-(theta / eps) * rectangle((z - theta) / eps) * grad).sum(0)
        return grad_z, grad_theta, None


class StepFunction(torch.autograd.Function):
    """H(z - theta) (the L0 count), pseudo-derivatives: d/dz = 0, d/dtheta = -(1 / eps) K((z - theta) / eps)."""

    @staticmethod
    def forward(ctx: Any, z: Tensor, theta: Tensor, bandwidth: float) -> Tensor:
        ctx.save_for_backward(z, theta)
        ctx.bandwidth = bandwidth
        return (z > theta).to(z.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        z, theta = ctx.saved_tensors
        eps = ctx.bandwidth
        grad_theta = (-(1.0 / eps) * rectangle((z - theta) / eps) * grad).sum(0)
        return torch.zeros_like(z), grad_theta, None


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


def _column_quantile(pre: Tensor, k: int) -> Tensor:
    """(n_latents,) each column's (1 - k/n_latents) sample quantile of pre (n, n_latents): the value
    exceeded on about k/n_latents of the rows (the round(n k / n_latents)-th largest, at least the largest)."""
    rank = max(1, round(pre.shape[0] * k / pre.shape[1]))
    return pre.topk(min(rank, pre.shape[0]), dim=0).values[-1]


def _sq_error(a: Tensor, b: Tensor) -> Tensor:
    """Per-element mean squared error (scalar)."""
    return (a - b).pow(2).mean()


# --- the shared base ---------------------------------------------------------------------------
class SAE(SparseModel):
    """What every SAE variant shares (see the module docstring). Subclasses implement `_sparsify`
    (inference codes from pre-activations at a given k) and `_train_terms` (training codes, scaled
    reconstruction and the named loss terms).

    Options (keyword-only, defaults):
    - `bias_init` ("mean"): initial `b_dec`, the mean of the `fit_init` sample, or its geometric
      median (robust when a few embeddings are far off).
    - `dead_steps` (50): a latent that stays zero on this many consecutive training batches is
      dead (AuxK revives dead latents in the TopK family; all report "dead_fraction"). Counted in
      steps, not tokens: at batch 256, 50 steps are 12,800 embeddings, so a live latent with
      frequency above ~1e-3 is practically never flagged, while short runs on small data sets
      (a few hundred steps) still get AuxK's help.
    """

    signed: ClassVar[bool] = False
    trainable: ClassVar[bool] = True

    def __init__(self, d: int, n_latents: int, k: int, *, bias_init: BiasInit = "mean", dead_steps: int = 50) -> None:
        super().__init__(d, n_latents, k)
        if bias_init not in ("mean", "geometric_median"):
            raise ValueError(f"{self.method}: bias_init must be 'mean' or 'geometric_median', got {bias_init!r}")
        if isinstance(dead_steps, bool) or not isinstance(dead_steps, int) or dead_steps < 1:
            raise ValueError(f"{self.method}: dead_steps must be an integer >= 1, got {dead_steps!r}")
        self.bias_init = bias_init
        self.dead_steps = int(dead_steps)
        atoms = torch.randn(n_latents, d)
        atoms /= atoms.norm(dim=1, keepdim=True).clamp_min(1e-12)
        self.W_dec = nn.Parameter(atoms)
        self.W_enc = nn.Parameter(atoms.clone())  # a copy: encoder and decoder train separately
        self.b_enc = nn.Parameter(torch.zeros(n_latents))
        self.b_dec = nn.Parameter(torch.zeros(d))
        self.register_buffer("input_scale", torch.ones(()))
        self.register_buffer("steps_since_active", torch.zeros(n_latents, dtype=torch.long))

    def options(self) -> dict[str, Any]:
        """Every keyword-only constructor option of the concrete class, read from the attribute of
        the same name (tuples as lists, for JSON); the signature is the single list of options."""
        out: dict[str, Any] = {}
        for name, p in inspect.signature(type(self).__init__).parameters.items():
            if p.kind is inspect.Parameter.KEYWORD_ONLY:
                value = getattr(self, name)
                out[name] = list(value) if isinstance(value, tuple) else value
        return out

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
        estimated on the pre-activations of at most THRESHOLD_SAMPLE_ROWS rows.
        """
        self.check_input(x)
        if x.shape[0] == 0:
            raise ValueError(f"{self.method}: fit_init needs at least one row, got an empty sample")
        x = x.to(device=self.W_dec.device, dtype=torch.float32)
        centre = x.mean(0) if self.bias_init == "mean" else geometric_median(x)
        spread = float((x - centre).norm(dim=1).mean())
        scale = math.sqrt(self.d) / spread if spread > 0 else 1.0
        self.input_scale.fill_(scale)
        self.b_dec.copy_(centre * scale)
        self.steps_since_active.zero_()
        self._init_sparsifier(self.pre_activations(x[:THRESHOLD_SAMPLE_ROWS] * scale))

    def _init_sparsifier(self, pre: Tensor) -> None:
        """Data-dependent sparsifier state from sample pre-activations (n, n_latents); default none."""

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

    def _sparsify(self, pre: Tensor, k: int) -> Tensor:
        raise NotImplementedError

    def _train_terms(self, xs: Tensor, pre: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """(training codes (n, m), scaled reconstruction (n, d), named loss terms, already weighted)."""
        raise NotImplementedError

    def dead_mask(self) -> Tensor:
        """(n_latents,) bool: latents inactive for at least `dead_steps` training steps."""
        return self.steps_since_active >= self.dead_steps

    def training_loss(self, x: Tensor, progress: float, generator: torch.Generator) -> tuple[Tensor, dict[str, Tensor]]:
        """Loss = sum of the variant's terms on batch x (n, d); updates the dead-latent counters."""
        self.check_input(x)
        xs = x * self.input_scale
        codes, recon, terms = self._train_terms(xs, self.pre_activations(xs))
        loss = torch.stack(list(terms.values())).sum()
        with torch.no_grad():
            active = codes != 0
            self.steps_since_active.add_(1).masked_fill_(active.any(0), 0)
            centred = (xs - xs.mean(0)).pow(2).sum().clamp_min(1e-12)
            stats = {
                "l0": active.sum(1).float().mean(),
                "fvu": (xs - recon).pow(2).sum() / centred,
                "dead_fraction": self.dead_mask().float().mean(),
                **{name: term.detach() for name, term in terms.items()},
            }
        return loss, stats

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


# --- the penalty SAEs: ReLU and JumpReLU, with the L0 controller ---------------------------------------
class PenaltySAE(SAE):
    """Base of the SAEs whose sparsity comes from a penalty coefficient instead of a k (ReLU: L1,
    JumpReLU: L0), with the optional controller that makes their `k` a target mean L0.

    The coefficient in use is the buffer `penalty_coef` (0-d, saved in checkpoints), starting at
    the initial coefficient (the subclass's `l1_coef` / `l0_coef` option). With `target_l0` on,
    each `training_loss` call, after computing the loss with the current coefficient, updates it
    from the batch's mean L0 with `l0_control_step` (rate `l0_control_rate`, relative error
    clipped to [-1, 1], kept within a factor PENALTY_COEF_RANGE of the initial value); the loss
    carries no gradient to it. Early stopping and best-epoch restore save and restore it with the
    weights (it is in the state dict). With
    `target_l0` off it never changes (the fixed-coefficient method).
    """

    #: an epoch counts as "at the target" when its validation L0 is within this factor of k
    L0_TOLERANCE: float = 1.25

    def acceptable(self, val_l0: float) -> bool:
        return not self.target_l0 or val_l0 <= self.L0_TOLERANCE * self.k

    def __init__(
        self,
        d: int,
        n_latents: int,
        k: int,
        *,
        coef_name: str,
        coef: float,
        target_l0: bool,
        l0_control_rate: float,
        bias_init: BiasInit,
        dead_steps: int,
    ) -> None:
        super().__init__(d, n_latents, k, bias_init=bias_init, dead_steps=dead_steps)
        if not (coef >= 0 and math.isfinite(coef)):
            raise ValueError(f"{self.method}: {coef_name} must be finite and >= 0, got {coef}")
        if not isinstance(target_l0, bool):
            raise ValueError(f"{self.method}: target_l0 must be true or false, got {target_l0!r}")
        if target_l0 and coef == 0:
            raise ValueError(f"{self.method}: {coef_name} must be > 0 with target_l0 (the controller multiplies it)")
        if not (l0_control_rate > 0 and math.isfinite(l0_control_rate)):
            raise ValueError(f"{self.method}: l0_control_rate must be finite and > 0, got {l0_control_rate}")
        self.target_l0 = target_l0
        self.l0_control_rate = float(l0_control_rate)
        self._coef_bounds = (float(coef) / PENALTY_COEF_RANGE, float(coef) * PENALTY_COEF_RANGE)
        self.register_buffer("penalty_coef", torch.tensor(float(coef)))

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        # Checkpoints written before the controller existed have no `penalty_coef`: they were trained
        # with the fixed initial coefficient, which is the buffer's value at construction.
        state_dict.setdefault(prefix + "penalty_coef", self.penalty_coef.detach().clone())
        super()._load_from_state_dict(state_dict, prefix, *args)

    def training_loss(self, x: Tensor, progress: float, generator: torch.Generator) -> tuple[Tensor, dict[str, Tensor]]:
        """The base loss (with the current coefficient), then one controller step when `target_l0`."""
        used = self.penalty_coef.detach().clone()
        loss, stats = super().training_loss(x, progress, generator)
        stats["penalty_coef"] = used
        if self.target_l0:
            with torch.no_grad():
                low, high = self._coef_bounds
                self.penalty_coef.copy_(l0_control_step(self.penalty_coef, stats["l0"], self.k, self.l0_control_rate, low, high))
        return loss, stats

    def _coef(self) -> Tensor:
        """The coefficient for this step's loss: a copy, as the buffer is updated in place after the forward pass."""
        return self.penalty_coef.detach().clone()


class ReLUSAE(PenaltySAE):
    """ReLU SAE: codes = ReLU(pre-activations); loss = MSE + c * E[sum_i f_i ||d_i||], c = `penalty_coef`.

    The L1 term weights each activation by its decoder row norm (Conerly et al. 2024), so the
    penalty cannot be dodged by shrinking codes and growing atoms; with unit-norm atoms the
    weight is 1 in value, but it stays in the graph as the method defines it.
    ReLU has no k in its sparsifier (`encode`'s k is ignored); the sparsity comes from c. With a
    fixed c every k of the sweep would train the same model at whatever L0 c happens to give,
    not comparable with the TopK family's points at L0 = k. So by default (`target_l0`) c adapts
    during training until the mean L0 is about k (see `PenaltySAE`, `l0_control_step`): the
    ReLU point of the FVU-vs-K plot then sits at its own k like every other method's.

    Options:
    - `l1_coef` (0.05): the initial (with `target_l0`) or fixed L1 weight c against the
      per-element MSE (about the FVU); with inputs of mean norm sqrt(d) an active code is
      O(sqrt(d / L0)), so 0.05 gives moderate sparsity; raise it for sparser codes.
    - `target_l0` (True): adapt c towards mean L0 = k; False keeps c = l1_coef (and a zero
      initial `b_enc`, i.e. exactly the fixed-coefficient method).
    - `l0_control_rate` (0.05): the controller's step; log c moves by at most this per step, so
      c can change 10x in ~50 steps. Measured on planted data (d 16, 64 latents, k 4 and 12, lr
      5e-4 to 5e-3, 420 steps): 0.02 - 0.1 all end with L0 within ~6 % of k, no oscillation.
    - plus `bias_init`, `dead_steps` (see `SAE`).

    With `target_l0`, `fit_init` also shifts `b_enc` so that each latent is positive on about a
    k/n_latents fraction of the sample (about k active per row, as JumpReLU's thresholds start):
    from a zero bias an untrained ReLU SAE fires on about half its latents, and pulling that down
    to k takes the encoder most of a short run (measured: L0 still 2-6 k after 420 steps at lr
    5e-4 to 1e-3), and the lagging response makes c overshoot (L0 swinging between ~0.2 k and
    3 k at lr 5e-3). The untrained twin then has about k active per row too.
    """

    method = "relu"

    def __init__(
        self,
        d: int,
        n_latents: int,
        k: int,
        *,
        l1_coef: float = 0.05,
        target_l0: bool = True,
        l0_control_rate: float = 0.05,
        bias_init: BiasInit = "mean",
        dead_steps: int = 50,
    ) -> None:
        super().__init__(
            d, n_latents, k, coef_name="l1_coef", coef=l1_coef, target_l0=target_l0, l0_control_rate=l0_control_rate,
            bias_init=bias_init, dead_steps=dead_steps,
        )
        self.l1_coef = float(l1_coef)

    def _init_sparsifier(self, pre: Tensor) -> None:
        """With `target_l0`: shift `b_enc` so each latent is positive on about a k/n_latents fraction of
        the sample (about k active per row), so the controller starts at its target instead of at the
        ~n_latents/2 of a zero bias, a distance the encoder would need most of a short run to cover."""
        if self.target_l0:
            self.b_enc.sub_(_column_quantile(pre, self.k))

    def _sparsify(self, pre: Tensor, k: int) -> Tensor:
        return F.relu(pre)

    def _train_terms(self, xs: Tensor, pre: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        codes = F.relu(pre)
        recon = self.decode_scaled(codes)
        l1 = (codes * self.W_dec.norm(dim=1)).sum(1).mean()
        return codes, recon, {"mse": _sq_error(recon, xs), "l1": self._coef() * l1}


# --- TopK and its family --------------------------------------------------------------------------
class TopKSAE(SAE):
    """TopK SAE (Gao et al. 2024): codes = the k largest of ReLU(pre-activations) per row.

    AuxK: when latents are dead, the residual e = xs - x^ (detached) is reconstructed from the
    top-k_aux ReLU pre-activations among the dead latents only (decoder without bias), and
    aux_coef * ||e^ - e||^2 / ||e||^2 (batch means) is added; its gradient reaches only the dead
    latents' encoder rows, biases and atoms (and b_dec through their pre-activations).

    Options:
    - `k_aux` (512): latents in the AuxK reconstruction, capped to the number of dead latents.
    - `aux_coef` (1/32): AuxK weight (the published setting).
    - plus `bias_init`, `dead_steps` (see `SAE`).
    `encode(x, k)`: keep k per row instead of the model's k.
    """

    method = "topk"

    def __init__(
        self, d: int, n_latents: int, k: int, *, k_aux: int = 512, aux_coef: float = 1 / 32, bias_init: BiasInit = "mean", dead_steps: int = 50
    ) -> None:
        super().__init__(d, n_latents, k, bias_init=bias_init, dead_steps=dead_steps)
        if isinstance(k_aux, bool) or not isinstance(k_aux, int) or k_aux < 1:
            raise ValueError(f"{self.method}: k_aux must be an integer >= 1, got {k_aux!r}")
        if not (aux_coef >= 0 and math.isfinite(aux_coef)):
            raise ValueError(f"{self.method}: aux_coef must be finite and >= 0, got {aux_coef}")
        self.k_aux = int(k_aux)
        self.aux_coef = float(aux_coef)

    def _sparsify(self, pre: Tensor, k: int) -> Tensor:
        return topk_codes(F.relu(pre), k)

    def _train_codes(self, pre: Tensor) -> Tensor:
        """Training codes (n, m); BatchTopK overrides (batch-level selection)."""
        return topk_codes(F.relu(pre), self.k)

    def _recon_loss(self, xs: Tensor, pre: Tensor, codes: Tensor, recon: Tensor) -> Tensor:
        """Reconstruction term; the Matryoshka variants override it with their nested losses."""
        return _sq_error(recon, xs)

    def auxk_loss(self, pre: Tensor, residual: Tensor) -> Tensor:
        """Normalised AuxK loss (unweighted) of the dead latents' top-k_aux codes against `residual`
        (n, d, detached); 0 when no latent is dead."""
        dead = self.dead_mask()
        n_dead = int(dead.sum())
        if n_dead == 0:
            return pre.new_zeros(())
        acts = torch.where(dead, F.relu(pre), torch.zeros_like(pre))
        aux_recon = topk_codes(acts, min(self.k_aux, n_dead)) @ self.W_dec
        return _sq_error(aux_recon, residual) / residual.pow(2).mean().clamp_min(1e-12)

    def _train_terms(self, xs: Tensor, pre: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        codes = self._train_codes(pre)
        recon = self.decode_scaled(codes)
        terms = {"mse": self._recon_loss(xs, pre, codes, recon)}
        if self.aux_coef > 0:
            terms["aux"] = self.aux_coef * self.auxk_loss(pre, (xs - recon).detach())
        return codes, recon, terms


class BatchTopKSAE(TopKSAE):
    """BatchTopK SAE (Bussmann et al. 2024): in training, the k * n largest ReLU pre-activations of
    the whole batch (n rows) survive, so rows share a budget of k on average.

    Inference uses a fixed threshold instead (codes = ReLU(pre) where it exceeds `threshold`), so a
    row's code does not depend on its batch. `threshold` is a registered buffer (saved in
    checkpoints): `fit_init` estimates it as the smallest value kept by a batch top-k over the
    sample (so the untrained twin has about k active per row), and each training step updates
    threshold <- threshold_decay * threshold + (1 - threshold_decay) * (smallest kept positive
    activation of the batch).
    `encode(x, k)` with k != the model's k keeps k per row (per-sample top-k): the threshold is
    calibrated for the model's k only.

    Options: `threshold_decay` (0.9): EMA decay, about the last 10 batches. The smallest kept value
    of a batch is an order statistic of k * batch values, so it is stable from batch to batch; a
    short memory matters more, because the activation scale moves while the encoder trains and a
    lagging threshold (0.99 remembers ~100 batches, a large part of a short run) gives a wrong L0
    at inference and a validation FVU that stalls. Plus the TopK options (AuxK) and
    `bias_init`, `dead_steps`.
    """

    method = "batchtopk"

    def __init__(
        self,
        d: int,
        n_latents: int,
        k: int,
        *,
        threshold_decay: float = 0.9,
        k_aux: int = 512,
        aux_coef: float = 1 / 32,
        bias_init: BiasInit = "mean",
        dead_steps: int = 50,
    ) -> None:
        super().__init__(d, n_latents, k, k_aux=k_aux, aux_coef=aux_coef, bias_init=bias_init, dead_steps=dead_steps)
        if not 0 <= threshold_decay < 1:
            raise ValueError(f"{self.method}: threshold_decay must be in [0, 1), got {threshold_decay}")
        self.threshold_decay = float(threshold_decay)
        self.register_buffer("threshold", torch.zeros(()))

    def _init_sparsifier(self, pre: Tensor) -> None:
        _, smallest = batch_topk_codes(F.relu(pre), self.k)
        self.threshold.fill_(float(smallest) if torch.isfinite(smallest) else 0.0)

    def _sparsify(self, pre: Tensor, k: int) -> Tensor:
        if k != self.k:
            return topk_codes(F.relu(pre), k)
        acts = F.relu(pre)
        return acts * (acts > self.threshold).to(acts.dtype)

    def _train_codes(self, pre: Tensor) -> Tensor:
        codes, smallest = batch_topk_codes(F.relu(pre), self.k)
        with torch.no_grad():
            blended = self.threshold_decay * self.threshold + (1 - self.threshold_decay) * smallest
            self.threshold.copy_(torch.where(torch.isnan(smallest), self.threshold, blended))
        return codes


# --- JumpReLU -----------------------------------------------------------------------------------
class JumpReLUSAE(PenaltySAE):
    """JumpReLU SAE (Rajamanoharan et al. 2024): codes = z * H(z - theta_i), theta_i = exp(log_threshold_i)
    learnable per latent; loss = MSE + c * E[L0], c = `penalty_coef`.

    The jump has no useful gradient, so the threshold learns through straight-through
    pseudo-derivatives with a rectangle kernel (`JumpReLUFunction`, `StepFunction`): only
    pre-activations within half a kernel width of a threshold move it. `fit_init` sets theta_i to
    latent i's (1 - k/n_latents) quantile on the sample, so every latent fires on about a
    k/n_latents fraction of rows (about k per row) from the start. Training then trades FVU
    against c * L0: with a fixed c the L0 drifts to wherever c puts it, the same for every k of
    the sweep, so the JumpReLU points would not be comparable with the TopK family's at L0 = k.
    By default (`target_l0`) c adapts during training to keep the mean L0 about k (see
    `PenaltySAE`, `l0_control_step`), as the paper tunes its coefficient to a target L0.
    `encode`'s k is ignored. Thresholds move slowly (Adam moves log theta by about lr per step,
    and only when a pre-activation falls in the kernel window): JumpReLU needs more steps or a
    larger lr than TopK to settle.

    Options:
    - `l0_coef` (1e-3): the initial (with `target_l0`) or fixed L0 weight c against the
      per-element MSE (about the FVU): a latent stays on for a row only if it lowers that row's
      FVU by more than about c.
    - `target_l0` (True): adapt c towards mean L0 = k; False keeps c = l0_coef.
    - `l0_control_rate` (0.02): the controller's step; log c moves by at most this per step.
      Smaller than ReLU's because L0 answers c more slowly here: c acts only on the thresholds,
      through the kernel window, and Adam moves log theta by about lr per step, so a faster c
      overshoots more (measured on planted data: 0.05 leaves L0 10-30 % off k where 0.02 is
      within 10 %).
    The penalty can only push L0 down: when the reconstruction itself lowers L0 (early in
    training the thresholds rise while the encoder, started as the decoder transpose, overshoots),
    the controller can only release it, and L0 returns to k as the encoder learns. And the
    default c (1e-3) may be far below the value that binds on a given data set (on the planted
    test data about 0.03 for k = 4): the controller then needs a few hundred steps to climb there
    (log c gains at most `l0_control_rate` per step); a larger initial `l0_coef` shortens that.
    - `bandwidth` (1e-3): the kernel width in the paper's units, inputs of unit mean squared
      norm; this module's inputs have mean norm sqrt(d), so the width used on pre-activations is
      `bandwidth * sqrt(d)` (`kernel_width`). That keeps the published 1e-3 meaning the same
      fraction of the activation scale at every d.
    - plus `bias_init`, `dead_steps` (see `SAE`).
    """

    method = "jumprelu"

    def __init__(
        self,
        d: int,
        n_latents: int,
        k: int,
        *,
        l0_coef: float = 1e-3,
        target_l0: bool = True,
        l0_control_rate: float = 0.02,
        bandwidth: float = 1e-3,
        bias_init: BiasInit = "mean",
        dead_steps: int = 50,
    ) -> None:
        super().__init__(
            d, n_latents, k, coef_name="l0_coef", coef=l0_coef, target_l0=target_l0, l0_control_rate=l0_control_rate,
            bias_init=bias_init, dead_steps=dead_steps,
        )
        if not (bandwidth > 0 and math.isfinite(bandwidth)):
            raise ValueError(f"jumprelu: bandwidth must be finite and > 0, got {bandwidth}")
        self.l0_coef = float(l0_coef)
        self.bandwidth = float(bandwidth)
        self.log_threshold = nn.Parameter(torch.full((n_latents,), math.log(0.1)))

    @property
    def threshold(self) -> Tensor:
        """(n_latents,) positive thresholds theta = exp(log_threshold), scaled space."""
        return self.log_threshold.exp()

    @property
    def kernel_width(self) -> float:
        """Rectangle-kernel width on the scaled pre-activations: bandwidth * sqrt(d)."""
        return self.bandwidth * math.sqrt(self.d)

    def _init_sparsifier(self, pre: Tensor) -> None:
        self.log_threshold.copy_(_column_quantile(pre, self.k).clamp_min(self.kernel_width).log())

    def _sparsify(self, pre: Tensor, k: int) -> Tensor:
        return JumpReLUFunction.apply(pre, self.threshold, self.kernel_width)

    def _train_terms(self, xs: Tensor, pre: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        theta = self.threshold
        codes = JumpReLUFunction.apply(pre, theta, self.kernel_width)
        recon = self.decode_scaled(codes)
        l0 = StepFunction.apply(pre, theta, self.kernel_width).sum(1).mean()
        return codes, recon, {"mse": _sq_error(recon, xs), "l0_penalty": self._coef() * l0}


# --- Matryoshka -----------------------------------------------------------------------------------
def _weights(weights: tuple[float, ...], n: int, name: str, method: str) -> tuple[float, ...]:
    """Loss weights normalised to sum 1 (uniform when empty), so nesting keeps the loss scale."""
    if not weights:
        return tuple(1.0 / n for _ in range(n))
    if len(weights) != n or any(not (w >= 0 and math.isfinite(w)) for w in weights) or sum(weights) <= 0:
        raise ValueError(f"{method}: {name} must be {n} finite non-negative numbers, not all 0 (one per level), got {list(weights)}")
    total = float(sum(weights))
    return tuple(float(w) / total for w in weights)


class MatryoshkaSAE(TopKSAE):
    """MSAE (Zaigrajew et al. 2025): TopK nested over k. One set of pre-activations, several TopK
    levels k_1 < ... < k_L = k; each level's reconstruction has its own MSE and the loss is their
    weighted sum (plus AuxK), so the first k_1 latents of a row alone must already reconstruct
    it well, and one model serves every k up to its own at inference.

    Options:
    - `k_levels` (() = derived from k: k/4, k/2, k, rounded, duplicates dropped): the levels; each
      in 1..k, k is appended when absent (inference uses k).
    - `level_weights` (() = uniform): one weight per resolved level, normalised to sum 1.
    - plus the TopK options (AuxK on the largest level's residual) and `bias_init`, `dead_steps`.
    """

    method = "matryoshka"

    def __init__(
        self,
        d: int,
        n_latents: int,
        k: int,
        *,
        k_levels: tuple[int, ...] = (),
        level_weights: tuple[float, ...] = (),
        k_aux: int = 512,
        aux_coef: float = 1 / 32,
        bias_init: BiasInit = "mean",
        dead_steps: int = 50,
    ) -> None:
        super().__init__(d, n_latents, k, k_aux=k_aux, aux_coef=aux_coef, bias_init=bias_init, dead_steps=dead_steps)
        levels = tuple(int(v) for v in k_levels) if k_levels else (k // 4, k // 2, k)
        if k_levels and any(not 1 <= v <= k for v in levels):
            raise ValueError(f"matryoshka: every k_levels value must be in 1..k={k}, got {list(k_levels)}")
        self.k_levels = tuple(sorted({v for v in levels if v >= 1} | {k}))
        self.level_weights = _weights(tuple(level_weights), len(self.k_levels), "level_weights", self.method)

    def _recon_loss(self, xs: Tensor, pre: Tensor, codes: Tensor, recon: Tensor) -> Tensor:
        values, indices = F.relu(pre).topk(self.k, dim=1, sorted=True)
        loss = self.level_weights[-1] * _sq_error(recon, xs)
        for level, weight in zip(self.k_levels[:-1], self.level_weights[:-1]):
            level_codes = torch.zeros_like(pre).scatter(1, indices[:, :level], values[:, :level])
            loss = loss + weight * _sq_error(self.decode_scaled(level_codes), xs)
        return loss


class PrefixMatryoshkaSAE(BatchTopKSAE):
    """Matryoshka SAE nested over dictionary prefixes (Bussmann et al. 2025; Nabeshima 2024): with
    BatchTopK codes, the first m_1 < ... < m_L = n_latents latents must each reconstruct the input
    on their own (reconstruction from codes[:, :m_j] plus b_dec), so early latents learn general
    features and later ones refine them. Loss = weighted sum of the prefix MSEs (plus AuxK).

    Options:
    - `prefix_fractions` ((0.125, 0.25, 0.5, 1.0)): prefix sizes as fractions of the dictionary,
      rounded, at least 1, duplicates dropped; 1.0 is appended when absent.
    - `prefix_weights` (() = uniform): one weight per resolved prefix, normalised to sum 1.
    - plus the BatchTopK options and `bias_init`, `dead_steps`.
    """

    method = "matryoshka_prefix"

    def __init__(
        self,
        d: int,
        n_latents: int,
        k: int,
        *,
        prefix_fractions: tuple[float, ...] = (0.125, 0.25, 0.5, 1.0),
        prefix_weights: tuple[float, ...] = (),
        threshold_decay: float = 0.9,
        k_aux: int = 512,
        aux_coef: float = 1 / 32,
        bias_init: BiasInit = "mean",
        dead_steps: int = 50,
    ) -> None:
        super().__init__(
            d, n_latents, k, threshold_decay=threshold_decay, k_aux=k_aux, aux_coef=aux_coef, bias_init=bias_init, dead_steps=dead_steps
        )
        fractions = tuple(float(f) for f in prefix_fractions)
        if not fractions or any(not 0 < f <= 1 for f in fractions):
            raise ValueError(f"matryoshka_prefix: prefix_fractions must be non-empty, each in (0, 1], got {list(prefix_fractions)}")
        sizes = sorted({max(1, round(f * n_latents)) for f in fractions} | {n_latents})
        self.prefix_fractions = tuple(sorted(set(fractions) | {1.0}))
        self.prefix_sizes = tuple(sizes)
        self.prefix_weights = _weights(tuple(prefix_weights), len(sizes), "prefix_weights", self.method)

    def _recon_loss(self, xs: Tensor, pre: Tensor, codes: Tensor, recon: Tensor) -> Tensor:
        loss = xs.new_zeros(())
        partial = self.b_dec.expand_as(xs)
        start = 0
        for size, weight in zip(self.prefix_sizes, self.prefix_weights):
            partial = partial + codes[:, start:size] @ self.W_dec[start:size]
            loss = loss + weight * _sq_error(partial, xs)
            start = size
        return loss


def fit(x: np.ndarray, method: str, dict_size: int, k: int, seed: int = 0, **options: Any) -> SAE:
    """Train an SAE of `method` on an in-memory float array x (n, d) and return it (eval mode).

    `options` takes the method's constructor options and TrainSettings fields (epochs, lr,
    batch_size, ...) in one flat namespace; `seed` seeds both the init and the loop. Runs
    `pipeline.train.fit_array`, the same loop as the training stage.
    """
    from pipeline.models import METHODS, build, model_class
    from pipeline.train import TrainSettings, fit_array, split_settings

    if method not in METHODS or not issubclass(model_class(method), SAE):
        saes = sorted(m for m in METHODS if METHODS[m].startswith(__name__ + ":"))
        raise ValueError(f"sae.fit: method must be one of {saes}, got {method!r}")
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"sae.fit: x must be a non-empty 2-D array (n, d), got shape {x.shape}")
    cls = model_class(method)
    model_keys = {name for name, p in inspect.signature(cls.__init__).parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    known = model_keys | (set(TrainSettings.__dataclass_fields__) - {"seed"})
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"sae.fit: unknown options {unknown} for {method}; known: {sorted(known)}")
    model_options, settings = split_settings({**options, "seed": seed})
    model = build(method, d=x.shape[1], dict_size=dict_size, k=k, seed=seed, **model_options)
    return fit_array(model, x, settings).model  # type: ignore[return-value]
