"""Matching binarised latents to binary attributes: one-to-one and FBMP (SPEC.md B).

Both work on counts. For 0/1 matrices, the true-positive count of every (latent, attribute)
pair is one matrix product `active^T @ targets`; precision, recall and F-scores follow from that
count, the number of positives per attribute and the number of activations per latent:

    F_beta(y, active_l) = (1 + beta^2) TP / (beta^2 |y| + |active_l|)

(the FN and FP terms cancel into |y| and |active_l|). So one step of FBMP for all latents and
all attributes is one (L, n) x (n, A) product plus O(L A) arithmetic, instead of L x A calls to
a per-pair scorer.

Degenerate cases (documented conventions):
- 0/0 F-scores are 0: an attribute with no positives scores 0 against every latent, and a latent
  that is never active scores 0 against every attribute.
- Ties go to the lowest latent index (np.argmax). An attribute with no positives therefore gets
  the coalition [0] and F1 = 0; it still counts in MATCHScore (drop such attributes before
  matching if they should not). A warning is logged.
- FBMP's accept test `F1(y, yhat') > F1(y, yhat)` is done in exact integer arithmetic
  (cross-multiplied counts), so no float rounding can add or drop a latent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)

# Rows converted to float32 per block in `_tp_counts`: about 32 MB of float32 per block at L = 4096.
_BLOCK_ELEMENTS = 8 * 1024 * 1024


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


def _check_inputs(active: np.ndarray, labels: np.ndarray) -> None:
    _check_bool("active", active)
    _check_bool("labels", labels)
    if labels.shape[0] != active.shape[0]:
        raise ValueError(f"labels: expected {active.shape[0]} rows like active, got shape {labels.shape}")
    empty = np.flatnonzero(~labels.any(axis=0))
    if empty.size:
        logger.warning("matching: %d attribute(s) have no positives (first: %s); their F1 is 0", empty.size, empty[:5].tolist())


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
    _check_inputs(active, labels)
    tp = _tp_counts(active, labels)
    f1 = _f1_from_counts(tp, labels.sum(axis=0)[None, :], active.sum(axis=0)[:, None])
    best = np.argmax(f1, axis=0)
    best_f1 = f1[best, np.arange(labels.shape[1])]
    return Matching(
        coalitions=[np.array([latent], dtype=np.int64) for latent in best],
        f1=best_f1,
        score=float(best_f1.mean()),
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
    _check_inputs(active, labels)
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
    running = np.arange(n_attr)
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
    f1 = _f1_from_counts(tp_hat, n_true, n_hat)
    return Matching(
        coalitions=[np.array(c, dtype=np.int64) for c in chosen],
        f1=f1,
        score=float(f1.mean()),
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
    """(A,) F1 of the OR of each attribute's coalition against its labels, on any (e.g. held-out) rows.

    active: (n, L) bool; labels: (n, A) bool; coalitions: one int array per attribute (from a
    Matching fitted elsewhere). One (n, L) x (L, A) product gives every coalition's OR at once.
    """
    _check_bool("active", active)
    _check_bool("labels", labels)
    if len(coalitions) != labels.shape[1]:
        raise ValueError(f"coalitions: expected one per attribute ({labels.shape[1]}), got {len(coalitions)}")
    member = np.zeros((active.shape[1], labels.shape[1]), dtype=np.float32)
    for a, coalition in enumerate(coalitions):
        member[np.asarray(coalition, dtype=np.int64), a] = 1.0
    yhat = (active.astype(np.float32) @ member) > 0
    tp = np.count_nonzero(yhat & labels, axis=0)
    return _f1_from_counts(tp, labels.sum(axis=0), yhat.sum(axis=0))
