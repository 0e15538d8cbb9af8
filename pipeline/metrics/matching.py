"""Matching binarised latents to binary attributes: one-to-one and FBMP (SPEC.md B).

Both work on counts. For 0/1 matrices, the true-positive count of every (latent, attribute)
pair is one matrix product `active^T @ targets`; precision, recall and F-scores follow from that
count, the number of positives per attribute and the number of activations per latent:

    F_beta(y, active_l) = (1 + beta^2) TP / (beta^2 |y| + |active_l|)

(the FN and FP terms cancel into |y| and |active_l|). So one step of FBMP for all latents and
all attributes is one (L, n) x (n, A) product plus O(L A) arithmetic, instead of L x A calls to
a per-pair scorer.

Binarisation (`binarise`): a latent is active where its activation exceeds a threshold; the published
evaluation code uses `> 1e-8` (`PUBLISHED_THRESHOLD`, the default), `> 0` is an option. Non-finite codes are an
error, never "inactive".

Degenerate cases (documented conventions):
- An attribute with no positives on the rows has no defined match: its coalition is empty, its F1 is NaN
  (a warning names it) and MATCHScore averages over the other attributes. A latent that is never active scores
  F1 = 0 against every attribute.
- Ties go to the lowest latent index (np.argmax).
- FBMP's accept test `F1(y, yhat') > F1(y, yhat)` is done in exact integer arithmetic
  (cross-multiplied counts), so no float rounding can add or drop a latent.
- Latent indices given from outside (`coalition_f1`, `pipeline.metrics.tapas`) must be integers in range:
  -1 would silently wrap to the last latent and 3.7 would be truncated.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from pipeline.records import Undefined

logger = logging.getLogger(__name__)

# Rows converted to float32 per block in `_tp_counts`: about 32 MB of float32 per block at L = 4096.
_BLOCK_ELEMENTS = 8 * 1024 * 1024

#: the published binarisation: a latent is active where its activation is > 1e-8
PUBLISHED_THRESHOLD = 1e-8


def binarise(codes: np.ndarray, threshold: float = PUBLISHED_THRESHOLD) -> np.ndarray:
    """bool (n, L): activation > threshold, for non-negative latent activations (n, L). NaN or infinite values are
    an error naming the first one (a NaN compared with a threshold would silently read as inactive)."""
    codes = np.asarray(codes)
    if codes.dtype.kind == "f" and not np.isfinite(codes).all():
        row, latent = np.argwhere(~np.isfinite(codes))[0]
        raise ValueError(f"codes: non-finite value {codes[row, latent]} at row {row}, latent {latent}; codes must be finite to binarise")
    return codes > threshold


def check_coalitions(coalitions: list[np.ndarray], n_latents: int, n_attributes: int) -> list[np.ndarray]:
    """The coalitions as int64 arrays, checked: one per attribute, 1-D, integer dtype, every index in [0, n_latents)."""
    if not isinstance(coalitions, (list, tuple)) or len(coalitions) != n_attributes:
        got = len(coalitions) if isinstance(coalitions, (list, tuple)) else type(coalitions).__name__
        raise ValueError(f"coalitions: expected one per attribute ({n_attributes}), got {got}")
    out = []
    for a, coalition in enumerate(coalitions):
        index = np.asarray(coalition)
        if index.size and (index.ndim != 1 or index.dtype.kind not in "iu"):
            raise TypeError(f"coalitions[{a}]: expected a 1-D array of integer latent indices, got {index.dtype} {index.shape}")
        if index.size and (index.min() < 0 or index.max() >= n_latents):
            raise ValueError(f"coalitions[{a}]: latent indices must be in [0, {n_latents}), got {index.min()}..{index.max()}")
        out.append(index.astype(np.int64).reshape(-1))
    return out


@dataclass
class Matching:
    """Matched latents per attribute.

    coalitions: per attribute, int64 latent indices in selection order (one for one-to-one).
    f1: (n_attributes,) float64, F1 of the OR of the coalition against the attribute labels.
    score: mean of f1 (MATCHScore, unweighted over attributes).
    """

    coalitions: list[np.ndarray]
    f1: np.ndarray
    score: float


def _check_bool(name: str, array: np.ndarray) -> None:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array, got {type(array).__name__}")
    if array.dtype != np.bool_:
        raise TypeError(f"{name}: expected a bool array (binarised), got dtype {array.dtype}")
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"{name}: expected a non-empty 2-D array, got shape {array.shape}")


def _check_inputs(active: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Check the pair; returns bool (A,): the attributes with at least one positive (the others are undefined)."""
    _check_bool("active", active)
    _check_bool("labels", labels)
    if labels.shape[0] != active.shape[0]:
        raise ValueError(f"labels: expected {active.shape[0]} rows like active, got shape {labels.shape}")
    defined = labels.any(axis=0)
    if not defined.all():
        empty = np.flatnonzero(~defined)
        logger.warning("matching: %d attribute(s) have no positive row (attributes %s); their F1 is NaN and they leave MATCHScore",
                       empty.size, empty[:10].tolist())
    return defined


def nan_mean(values: np.ndarray) -> float:
    """The mean over the defined (non-NaN) values, `Undefined` when none is: MATCHScore over the attributes with a match."""
    return float(np.nanmean(values)) if np.isfinite(values).any() else Undefined("no attribute has a positive row here")


def _tp_counts(active: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """(L, A) int64 counts of rows where latent l is active and target column a is true.

    active: (n, L) bool; targets: (n, A) bool. Computed as float32 products of 0/1 blocks of rows
    (exact: each block's counts are below 2^24) summed in float64, so memory stays at one block
    of `active` in float32 plus (L, A) accumulators.
    """
    n, n_latents = active.shape
    block = max(1, _BLOCK_ELEMENTS // max(n_latents, targets.shape[1]))
    out = np.zeros((n_latents, targets.shape[1]), dtype=np.float64)
    for start in range(0, n, block):
        a = active[start : start + block].astype(np.float32)
        t = targets[start : start + block].astype(np.float32)
        out += a.T @ t
    return np.rint(out).astype(np.int64)


def _f1_from_counts(tp: np.ndarray, n_true: np.ndarray, n_pred: np.ndarray) -> np.ndarray:
    """F1 = 2 TP / (|y| + |yhat|), 0 where both are empty. Arrays broadcast."""
    den = (n_true + n_pred).astype(np.float64)
    num = 2.0 * tp
    return np.divide(num, den, out=np.zeros(np.broadcast(num, den).shape), where=den > 0)


def one_to_one(active: np.ndarray, labels: np.ndarray) -> Matching:
    """For each attribute, the single latent with the highest F1 (ties: lowest index).

    active: (n, L) bool latent activations; labels: (n, A) bool attribute labels.
    """
    defined = _check_inputs(active, labels)
    tp = _tp_counts(active, labels)
    f1 = _f1_from_counts(tp, labels.sum(axis=0)[None, :], active.sum(axis=0)[:, None])
    best = np.argmax(f1, axis=0)
    best_f1 = np.where(defined, f1[best, np.arange(labels.shape[1])], np.nan)
    return Matching(
        coalitions=[np.array([latent] if ok else [], dtype=np.int64) for latent, ok in zip(best, defined)],
        f1=best_f1,
        score=nan_mean(best_f1),
    )


def fbmp(active: np.ndarray, labels: np.ndarray, beta: float = 0.5, k: int = 3) -> Matching:
    """Fully-Binary Matching Pursuit (SPEC.md B), all attributes at once.

    active: (n, L) bool latent activations; labels: (n, A) bool attribute labels.
    beta: F_beta weight for choosing latents against the residual (0.5 recommended).
    k: maximum coalition size, 1 <= k <= L.

    Per attribute: residual r = y; at each step pick the latent with the highest F_beta against r
    (ties: lowest index), drop its activations from r, and keep it only if F1(y, OR of the
    coalition) strictly improves (the first latent is always kept); the first rejection ends the
    coalition. Implementation: the residuals of all still-running attributes are the columns of
    an (n, A) bool matrix; each step takes one `_tp_counts` product for their TP counts, scores
    `TP / (beta^2 |r| + |active_l|)` (F_beta without its constant factor (1 + beta^2), same argmax),
    gathers the winning latent's column for every attribute at once and updates the (n, A)
    prediction matrix `yhat` with an OR. Only a list append per attribute runs in Python.
    """
    defined = _check_inputs(active, labels)
    if not (isinstance(beta, (int, float, np.floating)) and np.isfinite(beta) and beta > 0):
        raise ValueError(f"beta: expected a positive finite number, got {beta!r}")
    n_latents = active.shape[1]
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= n_latents:
        raise ValueError(f"k: expected an int in [1, {n_latents}] (the number of latents), got {k!r}")
    beta2 = float(beta) ** 2
    n_attr = labels.shape[1]
    n_true = labels.sum(axis=0).astype(np.int64)
    n_active = active.sum(axis=0).astype(np.float64)
    residual = labels.copy()
    yhat = np.zeros_like(labels)
    tp_hat = np.zeros(n_attr, dtype=np.int64)
    n_hat = np.zeros(n_attr, dtype=np.int64)
    chosen: list[list[int]] = [[] for _ in range(n_attr)]
    running = np.flatnonzero(defined)
    for step in range(k):
        if running.size == 0:
            break
        res = residual[:, running]
        tp = _tp_counts(active, res).astype(np.float64)
        den = beta2 * res.sum(axis=0)[None, :] + n_active[:, None]
        score = np.divide(tp, den, out=np.zeros_like(tp), where=den > 0)
        best = np.argmax(score, axis=0)
        gathered = active[:, best]
        new_hat = yhat[:, running] | gathered
        tp_new = np.count_nonzero(new_hat & labels[:, running], axis=0).astype(np.int64)
        n_new = np.count_nonzero(new_hat, axis=0).astype(np.int64)
        if step == 0:
            accept = np.ones(running.size, dtype=bool)
        else:
            # F1' > F1  <=>  2 TP' / (P + N') > 2 TP / (P + N)  <=>  TP' (P + N) > TP (P + N'), exact in int64.
            p = n_true[running]
            accept = tp_new * (p + n_hat[running]) > tp_hat[running] * (p + n_new)
        kept = running[accept]
        yhat[:, kept] = new_hat[:, accept]
        residual[:, kept] &= ~gathered[:, accept]
        tp_hat[kept] = tp_new[accept]
        n_hat[kept] = n_new[accept]
        for attribute, latent in zip(kept.tolist(), best[accept].tolist()):
            chosen[attribute].append(latent)
        running = kept
    f1 = np.where(defined, _f1_from_counts(tp_hat, n_true, n_hat), np.nan)
    return Matching(
        coalitions=[np.array(c, dtype=np.int64) for c in chosen],
        f1=f1,
        score=nan_mean(f1),
    )


def delta_match_score(trained: Matching, untrained: Matching) -> float:
    """Delta-MATCHScore = MATCHScore(trained) - MATCHScore(untrained), same attributes and matching."""
    if not isinstance(trained, Matching) or not isinstance(untrained, Matching):
        raise TypeError("trained, untrained: expected Matching results")
    if trained.f1.shape != untrained.f1.shape:
        raise ValueError(
            f"untrained: expected {trained.f1.shape[0]} attributes like trained, got {untrained.f1.shape[0]}"
        )
    return float(trained.score - untrained.score)


def coalition_f1(active: np.ndarray, labels: np.ndarray, coalitions: list[np.ndarray]) -> np.ndarray:
    """(A,) F1 of the OR of each attribute's coalition against its labels, on any (e.g. held-out) rows; NaN for an
    attribute with no positive row there (see the module docstring).

    active: (n, L) bool; labels: (n, A) bool; coalitions: one int array per attribute (from a
    Matching fitted elsewhere), indices checked. One (n, L) x (L, A) product gives every coalition's OR at once.
    """
    defined = _check_inputs(active, labels)
    member = np.zeros((active.shape[1], labels.shape[1]), dtype=np.float32)
    for a, coalition in enumerate(check_coalitions(coalitions, active.shape[1], labels.shape[1])):
        member[coalition, a] = 1.0
    yhat = (active.astype(np.float32) @ member) > 0
    tp = np.count_nonzero(yhat & labels, axis=0)
    return np.where(defined, _f1_from_counts(tp, labels.sum(axis=0), yhat.sum(axis=0)), np.nan)
