"""Matching binarised latents to binary attributes: one-to-one and FBMP (docs/science.md §3).

Both work on counts. For 0/1 matrices, the true-positive count of every (latent, attribute)
pair is one matrix product `active^T @ targets`; precision, recall and F-scores follow from that
count, the number of positives per attribute and the number of activations per latent:

    F_beta(y, active_l) = (1 + beta^2) TP / (beta^2 |y| + |active_l|)

(the FN and FP terms cancel into |y| and |active_l|). So one step of FBMP for all latents and
all attributes is one (L, n) x (n, A) product plus O(L A) arithmetic, instead of L x A calls to
a per-pair scorer.

Sparse codes: every function takes the binarised codes as a dense bool array or as any scipy.sparse matrix (a
k-sparse code of 120 k images over 16,384 latents is 30 MB as CSR, 7.9 GB dense); both become the same bool CSR
array (`pipeline.metrics.csr`) and go through the same exact arithmetic, so they give identical results. The
products never densify the codes: against sparse targets (FBMP's residuals) they are sparse x sparse in int64, so
their cost is about n x (active latents per row) x (true attributes per row), whatever L is; against dense
targets (the attribute labels) sparse x dense in float32 blocks, exact for integer counts (`_tp_counts`;
bench/bench_fbmp.py measures it).

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
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from pipeline.metrics.conventions import PUBLISHED_THRESHOLD
from pipeline.metrics.csr import column_counts, first_non_finite, is_sparse, row_of_entries, to_csr
from pipeline.metrics.threads import thread_map
from pipeline.records import Undefined

logger = logging.getLogger(__name__)

#: codes (n, L): a dense numpy array or any scipy.sparse matrix/array
Codes = np.ndarray | sparse.sparray | sparse.spmatrix
#: binarised codes (n, L): a bool numpy array or a bool scipy.sparse matrix/array
Active = np.ndarray | sparse.sparray | sparse.spmatrix



def binarise(codes: Codes, threshold: float = PUBLISHED_THRESHOLD) -> Active:
    """Active latents: activation > threshold, for non-negative latent activations (n, L).

    A dense array gives a bool array (n, L); a scipy.sparse matrix gives a bool CSR array holding exactly the active
    entries (the implicit zeros stay inactive, so the threshold must be >= 0). NaN or infinite values are an error
    naming the first one (a NaN compared with a threshold would silently read as inactive).
    """
    if is_sparse(codes):
        if not threshold >= 0:
            raise ValueError(f"threshold: expected >= 0 for sparse codes (their implicit zeros are inactive), got {threshold!r}")
        x = to_csr("codes", codes, allow_empty=True)
        bad = first_non_finite(x)
        if bad is not None:
            raise ValueError(f"codes: non-finite value {bad[2]} at row {bad[0]}, latent {bad[1]}; codes must be finite to binarise")
        keep = x.data > threshold
        counts = np.bincount(row_of_entries(x)[keep], minlength=x.shape[0])
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(x.indptr.dtype)
        return sparse.csr_array((np.ones(int(keep.sum()), dtype=bool), x.indices[keep], indptr), shape=x.shape)
    codes = np.asarray(codes)
    if codes.dtype.kind == "f" and not np.isfinite(codes).all():
        row, latent = np.argwhere(~np.isfinite(codes))[0]
        raise ValueError(f"codes: non-finite value {codes[row, latent]} at row {row}, latent {latent}; codes must be finite to binarise")
    return codes > threshold


def strongest(codes: Codes, k: int) -> sparse.csr_array:
    """Each row's `k` largest activations (n, L) as a CSR array, the rest zeroed; ties go to the lower latent index.

    A diagnostic beside MATCHScore for codes with more than k active latents per row: binarising counts a latent
    that fires at 1 % of its usual size like one that fires fully, so a model whose latents also fire weakly on rows
    without their concept loses precision there; its strongest-k codes show what the strong activations match.
    Vectorised: entries sorted by (row, -activation, latent), ranked within their row."""
    if k < 1:
        raise ValueError(f"k: expected >= 1, got {k}")
    x = to_csr("codes", codes, allow_empty=True)
    rows = row_of_entries(x)
    order = np.lexsort((x.indices, -x.data, rows))  # row first, then the largest activation, then the lowest latent
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order)) - x.indptr[rows[order]]
    keep = rank < k
    counts = np.bincount(rows[keep], minlength=x.shape[0])
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(x.indptr.dtype)
    return sparse.csr_array((x.data[keep], x.indices[keep], indptr), shape=x.shape)


def check_coalitions(coalitions: list[np.ndarray], n_latents: int, n_attributes: int) -> list[np.ndarray]:
    """The coalitions as int64 arrays, checked: one per attribute, 1-D, integer dtype, every index in [0, n_latents)
    (the bounds checked once over all of them: TAPAScore checks a rule's coalitions for every family)."""
    if not isinstance(coalitions, (list, tuple)) or len(coalitions) != n_attributes:
        got = len(coalitions) if isinstance(coalitions, (list, tuple)) else type(coalitions).__name__
        raise ValueError(f"coalitions: expected one per attribute ({n_attributes}), got {got}")
    given = [np.asarray(coalition) for coalition in coalitions]
    for a, index in enumerate(given):
        if index.size and (index.ndim != 1 or index.dtype.kind not in "iu"):
            raise TypeError(f"coalitions[{a}]: expected a 1-D array of integer latent indices, got {index.dtype} {index.shape}")
    out = [index.astype(np.int64, copy=False).reshape(-1) for index in given]
    every = np.concatenate(out) if out else np.zeros(0, np.int64)
    if every.size and (every.min() < 0 or every.max() >= n_latents):
        a, index = next((a, index) for a, index in enumerate(given) if index.size and (index.min() < 0 or index.max() >= n_latents))
        raise ValueError(f"coalitions[{a}]: latent indices must be in [0, {n_latents}), got {index.min()}..{index.max()}")
    return out


@dataclass
class Matching:
    """Matched latents per attribute.

    coalitions: per attribute, int64 latent indices in selection order (one for one-to-one).
    f1: (n_attributes,) float64, F1 of the OR of the coalition against the attribute labels.
    score: mean of f1 (MATCHScore, unweighted over attributes).
    prefix_f1: (k, n_attributes) float64, row j the F1 of the OR of each coalition's first j + 1 latents (the whole
    coalition where it is shorter; its last row is `f1`): FBMP is greedy, so its coalitions for a smaller k are these
    prefixes, and their in-sample scores come free (`truncated`).
    """

    coalitions: list[np.ndarray]
    f1: np.ndarray
    score: float
    prefix_f1: np.ndarray

    def truncated(self, k: int) -> "Matching":
        """The matching of the coalitions' first `k` latents (1 <= k <= len(prefix_f1)): FBMP's with that k."""
        if not 1 <= k <= len(self.prefix_f1):
            raise ValueError(f"k: expected 1 <= k <= {len(self.prefix_f1)} (the coalition size this matching was fitted with), got {k!r}")
        f1 = self.prefix_f1[k - 1]
        return Matching([c[:k] for c in self.coalitions], f1, nan_mean(f1), self.prefix_f1[:k])


def _check_active(active: Active) -> sparse.csr_array:
    """The binarised codes as a bool CSR array (n, L) holding only the active entries; dense or sparse bool input."""
    if is_sparse(active):
        if active.dtype != np.bool_:
            raise TypeError(f"active: expected bool (binarised) sparse codes, got dtype {active.dtype}")
        return to_csr("active", active)
    if not isinstance(active, np.ndarray):
        raise TypeError(f"active: expected a bool numpy array or scipy.sparse matrix, got {type(active).__name__}")
    if active.dtype != np.bool_:
        raise TypeError(f"active: expected a bool array (binarised), got dtype {active.dtype}")
    return to_csr("active", active)


def _check_labels(labels: np.ndarray, n: int) -> None:
    if not isinstance(labels, np.ndarray):
        raise TypeError(f"labels: expected a numpy array, got {type(labels).__name__}")
    if labels.dtype != np.bool_:
        raise TypeError(f"labels: expected a bool array, got dtype {labels.dtype}")
    if labels.ndim != 2 or labels.shape[0] == 0 or labels.shape[1] == 0:
        raise ValueError(f"labels: expected a non-empty 2-D array, got shape {labels.shape}")
    if labels.shape[0] != n:
        raise ValueError(f"labels: expected {n} rows like active, got shape {labels.shape}")


def _warn_undefined(defined: np.ndarray) -> None:
    if not defined.all():
        empty = np.flatnonzero(~defined)
        logger.warning("matching: %d attribute(s) have no positive row (attributes %s); their F1 is NaN and they leave MATCHScore",
                       empty.size, empty[:10].tolist())


def _check_inputs(active: Active, labels: np.ndarray) -> tuple[sparse.csr_array, np.ndarray]:
    """The checked pair: active as bool CSR, and bool (A,): the attributes with at least one positive (the others
    are undefined, with a warning)."""
    csr = _check_active(active)
    _check_labels(labels, csr.shape[0])
    defined = labels.any(axis=0)
    _warn_undefined(defined)
    return csr, defined


def nan_mean(values: np.ndarray) -> float:
    """The mean over the defined (non-NaN) values, `Undefined` when none is: MATCHScore over the attributes with a match."""
    return float(np.nanmean(values)) if np.isfinite(values).any() else Undefined("no attribute has a positive row here")


#: targets at least this dense (true entries / (rows x columns)) take the dense product: it costs every active entry
#: times every target column, the sparse product every matched (latent, target) pair. Measured on 2 cores, random
#: k = 32 codes, 312 targets, both ways (bench/bench_fbmp.py's sizes, 120 k x 16,384): sparse 0.28 s against dense
#: 0.42 s at 1 %, 0.42 against 0.33 s at 2 %, 1.05 against 0.36 s at 4 %; at 16 k x 4,096, 25 against 25 ms at 1 %,
#: 45 against 25 ms at 2 %. (Before threaded dense blocks the crossing was ~4 %.)
DENSE_TARGETS = 0.015
#: rows per block of the dense product: its float32 copy of the targets stays a few tens of MB
_BLOCK_ROWS = 32_768


def _tp_counts(active: sparse.csr_array, targets: np.ndarray | sparse.csc_array) -> np.ndarray:
    """(L, A) int64 counts of rows where latent l is active and target column a is true.

    active: bool CSR (n, L); targets: (n, A) bool, dense or sparse. Two exact ways, chosen by the density of the
    targets (`DENSE_TARGETS`): sparse targets (FBMP's residuals) go through one sparse x sparse product in int64,
    whose cost is the sum over rows of (active latents) x (true targets); dense ones (attribute labels) through
    sparse x dense products in float32 over blocks of rows, exact because every partial sum is an integer below
    2^24 (float64 beyond that many rows), the blocks spread over the process's threads (`thread_map`) (scipy's products
    run without the GIL: 1.84 s -> 1.00 s on 2 cores at 120 k x 16,384 x 308). Neither densifies the codes.
    """
    n = active.shape[0]
    true = targets.nnz if sparse.issparse(targets) else int(np.count_nonzero(targets))
    if n == 0 or true < DENSE_TARGETS * n * targets.shape[1]:
        targets = targets if sparse.issparse(targets) else sparse.csc_array(targets)
        return (active.T.astype(np.int64) @ targets.astype(np.int64)).toarray()
    dtype = np.float32 if n < 2**24 else np.float64

    def block(start: int) -> np.ndarray:
        rows = targets[start : start + _BLOCK_ROWS]
        rows = rows.toarray() if sparse.issparse(rows) else rows
        return active[start : start + _BLOCK_ROWS].T.astype(dtype) @ rows.astype(dtype)

    return sum(thread_map(block, range(0, n, _BLOCK_ROWS))).astype(np.int64)


def _column_sizes(x: sparse.csc_array) -> np.ndarray:
    """int64 (columns,): stored (true) entries per column of a bool CSC array without explicit zeros."""
    return np.diff(x.indptr).astype(np.int64)


def _f1_from_counts(tp: np.ndarray, n_true: np.ndarray, n_pred: np.ndarray) -> np.ndarray:
    """F1 = 2 TP / (|y| + |yhat|), 0 where both are empty. Arrays broadcast."""
    den = (n_true + n_pred).astype(np.float64)
    num = 2.0 * tp
    return np.divide(num, den, out=np.zeros(np.broadcast(num, den).shape), where=den > 0)


def tp_counts(active: Active, labels: np.ndarray) -> np.ndarray:
    """(L, A) int64: rows where latent l is active and attribute a is true. The product `one_to_one` and the first
    step of every `fbmp` compute; pass it to them (`tp=`) to compute it once for several matching rules."""
    active, _ = _check_inputs(active, labels)
    return _tp_counts(active, labels)


def _given_tp(tp: np.ndarray | None, active: sparse.csr_array, labels: np.ndarray) -> np.ndarray:
    if tp is None:
        return _tp_counts(active, labels)
    if tp.shape != (active.shape[1], labels.shape[1]):
        raise ValueError(f"tp: expected counts of shape {(active.shape[1], labels.shape[1])} (latents, attributes), got {tp.shape}")
    return tp


def one_to_one(active: Active, labels: np.ndarray, tp: np.ndarray | None = None) -> Matching:
    """For each attribute, the single latent with the highest F1 (ties: lowest index).

    active: (n, L) bool latent activations, dense or scipy.sparse; labels: (n, A) bool attribute labels.
    tp: `tp_counts(active, labels)` when already computed.
    """
    active, defined = _check_inputs(active, labels)
    tp = _given_tp(tp, active, labels)
    f1 = _f1_from_counts(tp, labels.sum(axis=0)[None, :], column_counts(active)[:, None])
    best = np.argmax(f1, axis=0)
    best_f1 = np.where(defined, f1[best, np.arange(labels.shape[1])], np.nan)
    return Matching(
        coalitions=[np.array([latent] if ok else [], dtype=np.int64) for latent, ok in zip(best, defined)],
        f1=best_f1,
        score=nan_mean(best_f1),
        prefix_f1=best_f1[None, :],
    )


def fbmp(active: Active, labels: np.ndarray, beta: float = 0.5, k: int = 3, tp: np.ndarray | None = None) -> Matching:
    """Fully-Binary Matching Pursuit (docs/science.md §3), all attributes at once.

    active: (n, L) bool latent activations, dense or scipy.sparse; labels: (n, A) bool attribute labels.
    beta: F_beta weight for choosing latents against the residual (0.5 recommended).
    k: maximum coalition size, 1 <= k <= L. tp: `tp_counts(active, labels)` when already computed (the first step's
    counts, the same for every beta).

    Per attribute: residual r = y; at each step pick the latent with the highest F_beta against r
    (ties: lowest index), drop its activations from r, and keep it only if F1(y, OR of the
    coalition) strictly improves (the first latent is always kept); the first rejection ends the
    coalition. Implementation: the residuals and predictions of the still-running attributes are the columns of
    bool CSC arrays (n, running); the TP counts against the residuals (L, running) start as TP(labels) (`tp`), and
    after each step but the last one `_tp_counts` product updates them: the previous counts less those of the
    labels the step newly covers (residual AND the chosen latent), or the residuals' own, whichever has fewer rows
    (strongly aligned latents cover most labels at once, weak ones few); the step scores
    `TP / (beta^2 |r| + |active_l|)` (F_beta without its constant factor (1 + beta^2), same argmax), gathers the
    winning latent's column for every attribute at once (from a CSC copy of the codes), updates the predictions
    with a sparse OR and the residuals with a sparse AND NOT, and keeps only the accepted columns. Only a list
    append per attribute runs in Python; nothing of size (n, A) or (n, L) is ever dense. After each step the F1 of every
    coalition so far is kept (`Matching.prefix_f1`): the scores of FBMP with any smaller k, at no extra product.
    """
    active, defined = _check_inputs(active, labels)
    if not (isinstance(beta, (int, float, np.floating)) and np.isfinite(beta) and beta > 0):
        raise ValueError(f"beta: expected a positive finite number, got {beta!r}")
    n_latents = active.shape[1]
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= n_latents:
        raise ValueError(f"k: expected an int in [1, {n_latents}] (the number of latents), got {k!r}")
    by_column = active.tocsc()
    beta2 = float(beta) ** 2
    n_attr = labels.shape[1]
    n_true = labels.sum(axis=0).astype(np.int64)
    n_active = column_counts(active).astype(np.float64)
    tp_hat = np.zeros(n_attr, dtype=np.int64)
    n_hat = np.zeros(n_attr, dtype=np.int64)
    chosen: list[list[int]] = [[] for _ in range(n_attr)]
    running = np.flatnonzero(defined)
    # the running attributes' residuals and predictions as bool CSC (n, running): set operations on their non-zeros
    # only, never an (n, A) dense array
    residual = sparse.csc_array(labels[:, running])
    yhat = sparse.csc_array((labels.shape[0], running.size), dtype=bool)
    counts = _given_tp(tp, active, labels)[:, running]  # (L, running): TP against the residuals
    prefix_f1 = np.full((k, n_attr), np.nan)  # stays NaN only where no attribute is defined
    for step in range(k):
        if running.size == 0:
            if step:
                prefix_f1[step:] = prefix_f1[step - 1]  # every coalition is complete
            break
        # where den is 0 (a dead latent against an empty residual) TP is 0 too: dividing by the smallest float scores 0
        den = np.maximum(beta2 * _column_sizes(residual)[:, None] + n_active[None, :], np.finfo(np.float64).tiny)
        best = np.argmax(counts.T / den, axis=1)  # (running, L): each attribute's scores contiguous
        gathered = by_column[:, best]
        new_hat = yhat.maximum(gathered)
        newly = residual.multiply(gathered)  # the labels the chosen latent covers that no earlier one did
        tp_new = tp_hat[running] + _column_sizes(newly)
        n_new = _column_sizes(new_hat)
        if step == 0:
            accept = np.ones(running.size, dtype=bool)
        else:
            # F1' > F1  <=>  2 TP' / (P + N') > 2 TP / (P + N)  <=>  TP' (P + N) > TP (P + N'), exact in int64.
            p = n_true[running]
            accept = tp_new * (p + n_hat[running]) > tp_hat[running] * (p + n_new)
        kept = running[accept]
        tp_hat[kept] = tp_new[accept]
        n_hat[kept] = n_new[accept]
        for attribute, latent in zip(kept.tolist(), best[accept].tolist()):
            chosen[attribute].append(latent)
        newly = newly[:, accept]
        residual, yhat, running = residual[:, accept] - newly, new_hat[:, accept], kept
        # the coalitions of step + 1 latents (or fewer, where rejected): their F1 from the running counts
        prefix_f1[step] = np.where(defined, _f1_from_counts(tp_hat, n_true, n_hat), np.nan)
        if step + 1 < k and running.size:  # the next step's counts, from the fewer rows: exact either way
            counts = counts[:, accept] - _tp_counts(active, newly) if newly.nnz < residual.nnz else _tp_counts(active, residual)
    f1 = prefix_f1[-1]
    return Matching(
        coalitions=[np.array(c, dtype=np.int64) for c in chosen],
        f1=f1,
        score=nan_mean(f1),
        prefix_f1=prefix_f1,
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


def coalition_members(rules: Sequence[list[np.ndarray]], n_latents: int, n_attributes: int) -> sparse.csr_array:
    """int32 CSR (L, R * A): column r * A + a holds 1 on the latents of attribute a's coalition in rule r (each rule one
    coalition per attribute, checked by `check_coalitions`): several matchings counted by one product
    (`member_counts`)."""
    columns, latents = [], []
    for r, coalitions in enumerate(rules):
        checked = check_coalitions(coalitions, n_latents, n_attributes)
        latents += checked
        columns.append(np.repeat(r * n_attributes + np.arange(n_attributes), [c.size for c in checked]))
    latents = np.concatenate(latents + [np.zeros(0, np.int64)])
    columns = np.concatenate(columns + [np.zeros(0, np.int64)])
    member = sparse.csr_array((np.ones(latents.size, dtype=np.int32), (latents, columns)), shape=(n_latents, len(rules) * n_attributes))
    member.sum_duplicates()
    return member


def member_counts(active: Active, labels: np.ndarray, members: sparse.csr_array) -> np.ndarray:
    """int64 (R, 3, A): for each rule of `coalition_members` and attribute, the true positives, predicted positives
    and true positives of the OR of its coalition on these rows (rows: TP, |yhat|, |y|). Counts add up over row
    blocks, so a held-out F1 can stream over a split of any size (`counts_f1`).

    active: (n, L) bool, dense or scipy.sparse; labels: (n, A) bool. One sparse (n, L) x (L, R A) product marks the
    (row, rule, attribute) whose coalition fires; the counts are bincounts over its non-zeros (never an (n, R A)
    dense array).
    """
    active = _check_active(active)
    _check_labels(labels, active.shape[0])
    n_attr = labels.shape[1]
    if not sparse.issparse(members) or members.shape[0] != active.shape[1] or n_attr == 0 or members.shape[1] % n_attr:
        raise ValueError(f"members: expected coalition_members(..., {active.shape[1]}, {n_attr}), got shape {getattr(members, 'shape', None)}")
    n_rules = members.shape[1] // n_attr
    fires = sparse.csr_array(active.astype(np.int32) @ members)  # no stored zeros: a product of non-negative counts
    rows = row_of_entries(fires)
    columns = fires.indices.astype(np.int64)
    true = labels[rows, columns % n_attr]
    n_pred = np.bincount(columns, minlength=members.shape[1])
    tp = np.bincount(columns[true], minlength=members.shape[1])
    n_true = np.tile(labels.sum(axis=0), n_rules)
    return np.stack([tp, n_pred, n_true]).astype(np.int64).reshape(3, n_rules, n_attr).transpose(1, 0, 2)


def coalition_counts(active: Active, labels: np.ndarray, coalitions: list[np.ndarray]) -> np.ndarray:
    """int64 (3, A): `member_counts` of a single rule (coalitions: one int array per attribute, from a Matching
    fitted elsewhere, indices checked)."""
    active = _check_active(active)
    _check_labels(labels, active.shape[0])
    return member_counts(active, labels, coalition_members([coalitions], active.shape[1], labels.shape[1]))[0]


def counts_f1(counts: np.ndarray, warn: bool = True) -> np.ndarray:
    """(A,) F1 from `coalition_counts` (summed over row blocks); NaN for an attribute with no positive row, with a
    warning unless `warn` is False (see the module docstring)."""
    tp, n_pred, n_true = np.asarray(counts, dtype=np.int64)
    defined = n_true > 0
    if warn:
        _warn_undefined(defined)
    return np.where(defined, _f1_from_counts(tp, n_true, n_pred), np.nan)


def coalition_f1(active: Active, labels: np.ndarray, coalitions: list[np.ndarray]) -> np.ndarray:
    """(A,) F1 of the OR of each attribute's coalition against its labels, on any (e.g. held-out) rows; NaN for an
    attribute with no positive row there (see the module docstring).

    active: (n, L) bool, dense or scipy.sparse; labels: (n, A) bool; coalitions: one int array per attribute.
    """
    return counts_f1(coalition_counts(active, labels, coalitions))
