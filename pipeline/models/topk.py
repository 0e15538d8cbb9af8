"""The TopK family of SAEs (docs/science.md §2): TopK with AuxK, BatchTopK, Matryoshka nested over k (MSAE) and
Matryoshka nested over dictionary prefixes. They keep k latents per row (BatchTopK: k per row on average in
training, a calibrated threshold at inference), and `encode(x, k)` may override the model's k at inference.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from pipeline.models.options import BatchTopKOptions, MatryoshkaOptions, PrefixMatryoshkaOptions, TopKOptions
from pipeline.models.sae import SAE, batch_topk_codes, sq_error, topk_codes


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

    Options = TopKOptions

    def _sparsify(self, pre: Tensor, k: int) -> Tensor:
        return topk_codes(F.relu(pre), k)

    def _train_codes(self, pre: Tensor) -> Tensor:
        """Training codes (n, m); BatchTopK overrides (batch-level selection)."""
        return topk_codes(F.relu(pre), self.k)

    def _recon_loss(self, xs: Tensor, pre: Tensor, codes: Tensor, recon: Tensor) -> Tensor:
        """Reconstruction term; the Matryoshka variants override it with their nested losses."""
        return sq_error(recon, xs)

    def auxk_loss(self, pre: Tensor, residual: Tensor) -> Tensor:
        """Normalised AuxK loss (unweighted) of the dead latents' top-k_aux codes against `residual`
        (n, d, detached); 0 when no latent is dead."""
        dead = self.dead_mask()
        n_dead = int(dead.sum())
        if n_dead == 0:
            return pre.new_zeros(())
        acts = torch.where(dead, F.relu(pre), torch.zeros_like(pre))
        aux_recon = topk_codes(acts, min(self.options.k_aux, n_dead)) @ self.W_dec
        return sq_error(aux_recon, residual) / residual.pow(2).mean().clamp_min(1e-12)

    def _train_terms(self, xs: Tensor, pre: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        codes = self._train_codes(pre)
        recon = self.decode_scaled(codes)
        terms = {"mse": self._recon_loss(xs, pre, codes, recon)}
        if self.options.aux_coef > 0:
            terms["aux"] = self.options.aux_coef * self.auxk_loss(pre, (xs - recon).detach())
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

    Options = BatchTopKOptions

    def __init__(self, d: int, n_latents: int, k: int, **options: Any) -> None:
        super().__init__(d, n_latents, k, **options)
        self.register_buffer("threshold", torch.zeros(()))

    def _init_sparsifier(self, xs: Tensor) -> None:
        _, smallest = batch_topk_codes(F.relu(self.pre_activations(xs)), self.k)
        self.threshold.fill_(float(smallest) if torch.isfinite(smallest) else 0.0)

    def _sparsify(self, pre: Tensor, k: int) -> Tensor:
        if k != self.k:
            return topk_codes(F.relu(pre), k)
        acts = F.relu(pre)
        return acts * (acts > self.threshold).to(acts.dtype)

    def _train_codes(self, pre: Tensor) -> Tensor:
        codes, smallest = batch_topk_codes(F.relu(pre), self.k)
        with torch.no_grad():
            decay = self.options.threshold_decay
            blended = decay * self.threshold + (1 - decay) * smallest
            self.threshold.copy_(torch.where(torch.isnan(smallest), self.threshold, blended))
        return codes



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

    Options = MatryoshkaOptions

    def __init__(self, d: int, n_latents: int, k: int, **options: Any) -> None:
        super().__init__(d, n_latents, k, **options)
        given = self.options.k_levels
        if any(v > k for v in given):
            raise ValueError(f"matryoshka: every k_levels value must be in 1..k={k}, got {list(given)}")
        levels = given or (k // 4, k // 2, k)
        self.k_levels = tuple(sorted({v for v in levels if v >= 1} | {k}))
        self.level_weights = _weights(self.options.level_weights, len(self.k_levels), "level_weights", self.method)

    def _recon_loss(self, xs: Tensor, pre: Tensor, codes: Tensor, recon: Tensor) -> Tensor:
        values, indices = F.relu(pre).topk(self.k, dim=1, sorted=True)
        loss = self.level_weights[-1] * sq_error(recon, xs)
        for level, weight in zip(self.k_levels[:-1], self.level_weights[:-1]):
            level_codes = torch.zeros_like(pre).scatter(1, indices[:, :level], values[:, :level])
            loss = loss + weight * sq_error(self.decode_scaled(level_codes), xs)
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
    - resampling (`resample_every`, on as for every SAE; see `SAE`): onto the residual's principal directions as
      they were it made this model worse on the planted case (49x -> 83x the oracle FVU at noise 0.01, median of 3
      seeds: a latent moved into an early prefix must reconstruct on its own there, and the prefix losses pulled it
      back); refined and untangled (`resample_refine`, `resample_untangle`, as BatchTopK's) it helps: 48.6x -> 18x
      at noise 0.01, 2.0x -> 1.4x at noise 0.1 (bench/bench_training_budget.py, 3 seeds).
    - plus the BatchTopK options and `bias_init`, `dead_steps`.
    """

    method = "matryoshka_prefix"

    Options = PrefixMatryoshkaOptions

    def __init__(self, d: int, n_latents: int, k: int, **options: Any) -> None:
        super().__init__(d, n_latents, k, **options)
        fractions = self.options.prefix_fractions
        if not fractions:
            raise ValueError("matryoshka_prefix: prefix_fractions must be non-empty, each in (0, 1]")
        self.prefix_sizes = tuple(sorted({max(1, round(f * n_latents)) for f in fractions} | {n_latents}))
        self.prefix_weights = _weights(self.options.prefix_weights, len(self.prefix_sizes), "prefix_weights", self.method)

    def _recon_loss(self, xs: Tensor, pre: Tensor, codes: Tensor, recon: Tensor) -> Tensor:
        loss = xs.new_zeros(())
        partial = self.b_dec.expand_as(xs)
        start = 0
        for size, weight in zip(self.prefix_sizes, self.prefix_weights):
            partial = partial + codes[:, start:size] @ self.W_dec[start:size]
            loss = loss + weight * sq_error(partial, xs)
            start = size
        return loss

