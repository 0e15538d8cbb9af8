"""TAPAScore and Delta-stay: do matched latents respond to a targeted one-attribute edit? (docs/science.md §3)

Pairs (x, x'): attribute `removed` present in x is replaced by `added` in x' (an attribute edit),
or only removed (object removal, added = -1). With I_add, I_rem the coalitions matched to those
attributes, latents in both dropped from both:

    delta_add = max_{i in I_add} bin(z'_i) - max_{i in I_add} bin(z_i)      in {-1, 0, 1}
    delta_rem = max_{i in I_rem} bin(z'_i) - max_{i in I_rem} bin(z_i)
    TAPAScore = mean_pairs(delta_add) - mean_pairs(delta_rem)               in [-2, 2]

Empty coalitions. A pair's added (removed) coalition can be empty: attribute index -1 (an object removal has
nothing added), an attribute matched to no latent, or every latent shared with the other coalition. Three
conventions, chosen with `empty`:
- "drop_pair" (default, the published evaluation code's): a pair that adds an attribute whose coalition is empty
  is left out of everything: both means and Delta-stay (the published code computes no added delta for it, and the
  pair's row of deltas is dropped as incomplete). An empty removed coalition's delta is 0 (the pair counts). Pairs
  that add nothing (object removals, added = -1) have no added term: delta_add is the mean over the pairs that add
  an attribute, and a removal-only benchmark gets TAPAScore = -mean(delta_rem) over all its pairs.
- "zero" (our earlier default, an option): every empty coalition's delta is 0 and every pair counts in both means.
- "skip" (an option): a pair contributes no term to the mean whose coalition is empty (an empty max is undefined,
  and a 0 pulls the mean towards "no response" for reasons unrelated to the model); a mean with no term is NaN and
  TAPAScore is then the other mean alone.
In all three, TAPAScore is NaN (logged) when no pair has any non-empty coalition: nothing was matched, and 0 would
look like a measured "no response".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import sparse

from pipeline.metrics.csr import is_sparse, row_of_entries, to_csr
from pipeline.metrics.matching import Active, check_coalitions
from pipeline.records import Undefined

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tapas:
    """TAPAScore over pairs. delta_add/delta_rem: the two means (see `empty` in `tapascore`). n_pairs: pairs given;
    n_add, n_rem: pairs whose added / removed coalition is non-empty; n_scored: pairs in the means (all but the
    dropped ones under "drop_pair"). empty: the convention used."""

    score: float
    delta_add: float
    delta_rem: float
    n_pairs: int
    n_add: int = 0
    n_rem: int = 0
    n_scored: int = 0
    empty: str = "drop_pair"

#: the conventions for empty coalitions (module docstring)
EMPTY = ("drop_pair", "zero", "skip")


def _check_codes(before: Active, after: Active) -> tuple[sparse.csr_array, sparse.csr_array]:
    """Both sides as bool CSR arrays (n_pairs, L) holding the active entries; dense or sparse bool input."""
    out = []
    for name, array in (("before", before), ("after", after)):
        if getattr(array, "dtype", None) != np.bool_ or not (isinstance(array, np.ndarray) or is_sparse(array)):
            raise TypeError(f"{name}: expected a bool numpy array or scipy.sparse matrix (binarised codes), got {getattr(array, 'dtype', type(array))}")
        if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
            raise ValueError(f"{name}: expected a non-empty 2-D array (n_pairs, n_latents), got shape {array.shape}")
        out.append(to_csr(name, array))
    if after.shape != before.shape:
        raise ValueError(f"after: expected the shape of before {before.shape}, got {after.shape}")
    return out[0], out[1]


def _membership(coalitions: list[np.ndarray], n_latents: int) -> sparse.csr_array:
    """bool CSR (n_attributes, n_latents): True where the latent is in the attribute's coalition (indices checked)."""
    if not isinstance(coalitions, (list, tuple)) or len(coalitions) == 0:
        raise ValueError("coalitions: expected a non-empty list of int arrays, one per attribute")
    checked = check_coalitions(coalitions, n_latents, len(coalitions))
    rows = np.repeat(np.arange(len(checked)), [c.size for c in checked])
    columns = np.concatenate([*checked, np.zeros(0, np.int64)])
    member = sparse.csr_array((np.ones(rows.size, dtype=bool), (rows, columns)), shape=(len(checked), n_latents))
    member.sum_duplicates()
    return member


def _check_attribute_index(name: str, index: np.ndarray, n_pairs: int, n_attributes: int) -> None:
    if not isinstance(index, np.ndarray) or index.dtype.kind not in "iu":
        got = getattr(index, "dtype", type(index))
        raise TypeError(f"{name}: expected an int numpy array of attribute indices (-1 = none), got {got}")
    if index.shape != (n_pairs,):
        raise ValueError(f"{name}: expected shape ({n_pairs},), got {index.shape}")
    if index.size and (index.min() < -1 or index.max() >= n_attributes):
        raise ValueError(f"{name}: expected indices in [-1, {n_attributes}), got {index.min()}..{index.max()}")


def _in_set(member: sparse.csr_array, attribute: np.ndarray, latents: np.ndarray) -> np.ndarray:
    """bool (m,): whether latents[i] is in the coalition of attribute[i] (False where attribute[i] = -1)."""
    valid = attribute >= 0
    out = np.zeros(latents.size, dtype=bool)
    if valid.any():
        out[valid] = np.asarray(member[attribute[valid], latents[valid]]).ravel()
    return out


def _coalition_on(codes: sparse.csr_array, member: sparse.csr_array, added: np.ndarray, removed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n_pairs,) int each: max over the pair's I_add (resp. I_rem) of its binarised code, 0 for an empty set.

    I_add = coalition(added) minus coalition(removed), I_rem the other way round (shared latents dropped from both).
    Works on the active entries only: for each active (pair, latent), whether the latent is in the pair's I_add
    and I_rem, then a per-pair OR (a bincount), so nothing of size (n_pairs, L) is built.
    """
    rows, latents = row_of_entries(codes), codes.indices.astype(np.int64)
    in_add = _in_set(member, added[rows], latents)
    in_rem = _in_set(member, removed[rows], latents)
    n = codes.shape[0]
    on_add = np.bincount(rows[in_add & ~in_rem], minlength=n) > 0
    on_rem = np.bincount(rows[in_rem & ~in_add], minlength=n) > 0
    return on_add.astype(np.int64), on_rem.astype(np.int64)


def _dropped(member: sparse.csr_array, added: np.ndarray, removed: np.ndarray, empty: str) -> np.ndarray:
    """bool (n_pairs,): the pairs left out of everything under `empty` ("drop_pair": those adding an attribute whose
    coalition, less the removed one's latents, is empty; none otherwise)."""
    if empty != "drop_pair":
        return np.zeros(added.shape, dtype=bool)
    nonempty_add, _ = _nonempty(member, added, removed)
    return (added >= 0) & ~nonempty_add


def _nonempty(member: sparse.csr_array, added: np.ndarray, removed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n_pairs,) bool each: whether I_add (resp. I_rem) is non-empty, from the coalition sizes and overlaps."""
    size = np.diff(member.indptr).astype(np.int64)
    counts = member.astype(np.int64)
    overlap = (counts @ counts.T).toarray()  # (A, A) shared latents between two coalitions
    a, r = np.maximum(added, 0), np.maximum(removed, 0)
    shared = np.where((added >= 0) & (removed >= 0), overlap[a, r], 0)
    return (added >= 0) & (size[a] - shared > 0), (removed >= 0) & (size[r] - shared > 0)


def tapascore(
    before: Active,
    after: Active,
    added: np.ndarray,
    removed: np.ndarray,
    coalitions: list[np.ndarray],
    empty: Literal["drop_pair", "zero", "skip"] = "drop_pair",
) -> Tapas:
    """TAPAScore of binarised codes before/after (n_pairs, L) bool, dense or scipy.sparse, for edits
    added/removed (n_pairs,) int.

    coalitions: per attribute, the int latent indices matched to it (e.g. `Matching.coalitions`).
    empty: how a pair with an empty coalition counts (module docstring): "drop_pair" (published), "zero" or "skip".
    Vectorised over the active entries of the codes (`_coalition_on`); dense and sparse codes give the same result.
    """
    if empty not in EMPTY:
        raise ValueError(f"empty: expected one of {list(EMPTY)}, got {empty!r}")
    before, after = _check_codes(before, after)
    n_pairs, n_latents = before.shape
    member = _membership(coalitions, n_latents)
    _check_attribute_index("added", added, n_pairs, member.shape[0])
    _check_attribute_index("removed", removed, n_pairs, member.shape[0])
    nonempty_add, nonempty_rem = _nonempty(member, added, removed)
    add_after, rem_after = _coalition_on(after, member, added, removed)
    add_before, rem_before = _coalition_on(before, member, added, removed)
    d_add, d_rem = add_after - add_before, rem_after - rem_before
    # an empty coalition's delta is 0 already (`_coalition_on` of an empty set); the conventions choose the terms
    if empty == "skip":
        has_add, has_rem = nonempty_add, nonempty_rem
    elif empty == "zero":
        has_add = has_rem = np.ones(n_pairs, bool)
    else:
        kept = ~_dropped(member, added, removed, empty)
        has_add, has_rem = kept & (added >= 0), kept
    mean_add = float(d_add[has_add].mean()) if has_add.any() else Undefined("no pair adds an attribute with a coalition")
    mean_rem = float(d_rem[has_rem].mean()) if has_rem.any() else Undefined("no pair removes an attribute with a coalition")
    if not (nonempty_add.any() or nonempty_rem.any()):
        logger.warning("tapascore: no pair has a non-empty added or removed coalition (nothing was matched); score is NaN")
        score = Undefined("no pair has a non-empty added or removed coalition (nothing was matched)")
    elif np.isnan(mean_add) and np.isnan(mean_rem):
        score = Undefined("every pair was left out: their added coalitions are empty")
    else:
        score = (0.0 if np.isnan(mean_add) else mean_add) - (0.0 if np.isnan(mean_rem) else mean_rem)
    return Tapas(
        score=score,
        delta_add=mean_add,
        delta_rem=mean_rem,
        n_pairs=n_pairs,
        n_add=int(nonempty_add.sum()),
        n_rem=int(nonempty_rem.sum()),
        n_scored=int((has_add | has_rem).sum()),
        empty=empty,
    )


def delta_stay(
    before: Active,
    after: Active,
    present: np.ndarray,
    added: np.ndarray,
    removed: np.ndarray,
    coalitions: list[np.ndarray],
    empty: Literal["drop_pair", "zero", "skip"] = "drop_pair",
) -> float:
    """Delta-stay: mean |delta| over attributes present in x and not part of the edit (leakage).

    before, after: (n_pairs, L) bool, dense or scipy.sparse; present: (n_pairs, A) bool, attributes present in the
    base image x; added, removed: (n_pairs,) int (-1 = none); coalitions: A int arrays.
    delta for attribute a = max over a's full coalition of bin(z') - the same for bin(z). Entries
    whose coalition is empty are skipped, and so are the pairs `empty` drops ("drop_pair": those adding an attribute
    whose coalition is empty, as in `tapascore`). Returns NaN (logged) when no (pair, attribute) entry
    qualifies. Lower is better: 0 = nothing outside the edit moved.
    """
    before, after = _check_codes(before, after)
    n_pairs, n_latents = before.shape
    member = _membership(coalitions, n_latents)
    n_attr = member.shape[0]
    if not isinstance(present, np.ndarray) or present.dtype != np.bool_:
        raise TypeError(f"present: expected a bool numpy array, got {getattr(present, 'dtype', type(present))}")
    if present.shape != (n_pairs, n_attr):
        raise ValueError(f"present: expected shape ({n_pairs}, {n_attr}) (pairs, attributes), got {present.shape}")
    _check_attribute_index("added", added, n_pairs, n_attr)
    _check_attribute_index("removed", removed, n_pairs, n_attr)
    member_t = member.T.astype(np.int64)
    on_before = (before.astype(np.int64) @ member_t).toarray() > 0
    on_after = (after.astype(np.int64) @ member_t).toarray() > 0
    delta = np.abs(on_after.astype(np.int64) - on_before.astype(np.int64))
    rows = np.arange(n_pairs)
    in_edit = np.zeros((n_pairs, n_attr), dtype=bool)
    in_edit[rows[added >= 0], added[added >= 0]] = True
    in_edit[rows[removed >= 0], removed[removed >= 0]] = True
    if empty not in EMPTY:
        raise ValueError(f"empty: expected one of {list(EMPTY)}, got {empty!r}")
    keep = present & ~in_edit & (np.diff(member.indptr) > 0)[None, :] & ~_dropped(member, added, removed, empty)[:, None]
    if not keep.any():
        logger.warning("delta_stay: no present attribute outside the edit has a coalition; returning NaN")
        return Undefined("no present attribute outside the edit has a coalition")
    return float(delta[keep].mean())
