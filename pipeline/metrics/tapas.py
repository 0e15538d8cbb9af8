"""TAPAScore and Delta-stay: do matched latents respond to a targeted one-attribute edit? (SPEC.md B)

Pairs (x, x'): attribute `removed` present in x is replaced by `added` in x' (an attribute edit),
or only removed (object removal, added = -1). With I_add, I_rem the coalitions matched to those
attributes, latents in both dropped from both:

    delta_add = max_{i in I_add} bin(z'_i) - max_{i in I_add} bin(z_i)      in {-1, 0, 1}
    delta_rem = max_{i in I_rem} bin(z'_i) - max_{i in I_rem} bin(z_i)
    TAPAScore = mean_pairs(delta_add) - mean_pairs(delta_rem)               in [-2, 2]

Empty coalitions. A pair's added (removed) coalition can be empty: attribute index -1 (an object removal has
nothing added), an attribute matched to no latent, or every latent shared with the other coalition. Two
conventions, chosen with `empty`:
- "zero" (default, the published evaluation code's): an empty coalition's delta is 0 and the pair still counts, so
  both means run over all pairs; a removal-only benchmark gets TAPAScore = -mean(delta_rem) over all pairs.
- "skip" (ours, an option): the pair contributes no term to that mean (an empty max is undefined, and a 0 pulls
  the mean towards "no response" for reasons unrelated to the model); a mean with no term is NaN and TAPAScore is
  then the other mean alone.
In both, TAPAScore is NaN (logged) when no pair has any non-empty coalition: nothing was matched, and 0 would
look like a measured "no response".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np

from pipeline.metrics.matching import check_coalitions
from pipeline.records import Undefined

logger = logging.getLogger(__name__)


@dataclass
class Tapas:
    """TAPAScore over pairs. delta_add/delta_rem: the two means (see `empty` in `tapascore`). n_pairs: pairs given;
    n_add, n_rem: pairs whose added / removed coalition is non-empty. empty: the convention used."""

    score: float
    delta_add: float
    delta_rem: float
    n_pairs: int
    n_add: int = 0
    n_rem: int = 0
    empty: str = "zero"


def _check_codes(before: np.ndarray, after: np.ndarray) -> None:
    for name, array in (("before", before), ("after", after)):
        if not isinstance(array, np.ndarray) or array.dtype != np.bool_:
            raise TypeError(f"{name}: expected a bool numpy array (binarised codes), got {getattr(array, 'dtype', type(array))}")
        if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
            raise ValueError(f"{name}: expected a non-empty 2-D array (n_pairs, n_latents), got shape {array.shape}")
    if after.shape != before.shape:
        raise ValueError(f"after: expected the shape of before {before.shape}, got {after.shape}")


def _membership(coalitions: list[np.ndarray], n_latents: int) -> np.ndarray:
    """(n_attributes, n_latents) bool: True where the latent is in the attribute's coalition (indices checked)."""
    if not isinstance(coalitions, (list, tuple)) or len(coalitions) == 0:
        raise ValueError("coalitions: expected a non-empty list of int arrays, one per attribute")
    member = np.zeros((len(coalitions), n_latents), dtype=bool)
    for a, coalition in enumerate(check_coalitions(coalitions, n_latents, len(coalitions))):
        member[a, coalition] = True
    return member


def _check_attribute_index(name: str, index: np.ndarray, n_pairs: int, n_attributes: int) -> None:
    if not isinstance(index, np.ndarray) or index.dtype.kind not in "iu":
        got = getattr(index, "dtype", type(index))
        raise TypeError(f"{name}: expected an int numpy array of attribute indices (-1 = none), got {got}")
    if index.shape != (n_pairs,):
        raise ValueError(f"{name}: expected shape ({n_pairs},), got {index.shape}")
    if index.size and (index.min() < -1 or index.max() >= n_attributes):
        raise ValueError(f"{name}: expected indices in [-1, {n_attributes}), got {index.min()}..{index.max()}")


def _edit_sets(member: np.ndarray, added: np.ndarray, removed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n_pairs, n_latents) bool I_add and I_rem per pair, shared latents dropped from both."""
    add = member[np.maximum(added, 0)] & (added >= 0)[:, None]
    rem = member[np.maximum(removed, 0)] & (removed >= 0)[:, None]
    shared = add & rem
    return add & ~shared, rem & ~shared


def _coalition_on(codes: np.ndarray, sets: np.ndarray) -> np.ndarray:
    """(n_pairs,) int: max over the pair's latent set of its binarised code (0 for an empty set)."""
    return np.any(codes & sets, axis=1).astype(np.int64)


def tapascore(
    before: np.ndarray,
    after: np.ndarray,
    added: np.ndarray,
    removed: np.ndarray,
    coalitions: list[np.ndarray],
    empty: Literal["zero", "skip"] = "zero",
) -> Tapas:
    """TAPAScore of binarised codes before/after (n_pairs, L) bool for edits added/removed (n_pairs,) int.

    coalitions: per attribute, the int latent indices matched to it (e.g. `Matching.coalitions`).
    empty: how a pair with an empty coalition counts (module docstring): "zero" (published) or "skip".
    Vectorised over pairs: each pair's coalitions become rows of an (n_pairs, L) bool mask.
    """
    if empty not in ("zero", "skip"):
        raise ValueError(f"empty: expected 'zero' or 'skip', got {empty!r}")
    _check_codes(before, after)
    n_pairs, n_latents = before.shape
    member = _membership(coalitions, n_latents)
    _check_attribute_index("added", added, n_pairs, member.shape[0])
    _check_attribute_index("removed", removed, n_pairs, member.shape[0])
    add, rem = _edit_sets(member, added, removed)
    nonempty_add, nonempty_rem = add.any(axis=1), rem.any(axis=1)
    d_add = _coalition_on(after, add) - _coalition_on(before, add)
    d_rem = _coalition_on(after, rem) - _coalition_on(before, rem)
    # "zero": every pair is a term (an empty coalition's delta is 0 already: `_coalition_on` of an empty set)
    has_add, has_rem = (nonempty_add, nonempty_rem) if empty == "skip" else (np.ones(n_pairs, bool),) * 2
    mean_add = float(d_add[has_add].mean()) if has_add.any() else Undefined("no pair adds an attribute with a coalition")
    mean_rem = float(d_rem[has_rem].mean()) if has_rem.any() else Undefined("no pair removes an attribute with a coalition")
    if not (nonempty_add.any() or nonempty_rem.any()):
        logger.warning("tapascore: no pair has a non-empty added or removed coalition (nothing was matched); score is NaN")
        score = Undefined("no pair has a non-empty added or removed coalition (nothing was matched)")
    else:
        score = (0.0 if np.isnan(mean_add) else mean_add) - (0.0 if np.isnan(mean_rem) else mean_rem)
    return Tapas(
        score=score,
        delta_add=mean_add,
        delta_rem=mean_rem,
        n_pairs=n_pairs,
        n_add=int(nonempty_add.sum()),
        n_rem=int(nonempty_rem.sum()),
        empty=empty,
    )


def delta_stay(
    before: np.ndarray,
    after: np.ndarray,
    present: np.ndarray,
    added: np.ndarray,
    removed: np.ndarray,
    coalitions: list[np.ndarray],
) -> float:
    """Delta-stay: mean |delta| over attributes present in x and not part of the edit (leakage).

    before, after: (n_pairs, L) bool; present: (n_pairs, A) bool, attributes present in the base
    image x; added, removed: (n_pairs,) int (-1 = none); coalitions: A int arrays.
    delta for attribute a = max over a's full coalition of bin(z') - the same for bin(z). Entries
    whose coalition is empty are skipped. Returns NaN (logged) when no (pair, attribute) entry
    qualifies. Lower is better: 0 = nothing outside the edit moved.
    """
    _check_codes(before, after)
    n_pairs, n_latents = before.shape
    member = _membership(coalitions, n_latents)
    n_attr = member.shape[0]
    if not isinstance(present, np.ndarray) or present.dtype != np.bool_:
        raise TypeError(f"present: expected a bool numpy array, got {getattr(present, 'dtype', type(present))}")
    if present.shape != (n_pairs, n_attr):
        raise ValueError(f"present: expected shape ({n_pairs}, {n_attr}) (pairs, attributes), got {present.shape}")
    _check_attribute_index("added", added, n_pairs, n_attr)
    _check_attribute_index("removed", removed, n_pairs, n_attr)
    member_f = member.T.astype(np.float32)
    on_before = (before.astype(np.float32) @ member_f) > 0
    on_after = (after.astype(np.float32) @ member_f) > 0
    delta = np.abs(on_after.astype(np.int64) - on_before.astype(np.int64))
    rows = np.arange(n_pairs)
    in_edit = np.zeros((n_pairs, n_attr), dtype=bool)
    in_edit[rows[added >= 0], added[added >= 0]] = True
    in_edit[rows[removed >= 0], removed[removed >= 0]] = True
    keep = present & ~in_edit & member.any(axis=1)[None, :]
    if not keep.any():
        logger.warning("delta_stay: no present attribute outside the edit has a coalition; returning NaN")
        return Undefined("no present attribute outside the edit has a coalition")
    return float(delta[keep].mean())
