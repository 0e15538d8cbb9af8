"""Tests for pipeline.metrics.tapas: TAPAScore and Delta-stay on paired images."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.metrics.tapas import Tapas, delta_stay, tapascore

# Attribute 0 -> latents {0, 1}; attribute 1 -> {2, 3}; attribute 2 -> {3, 4} (shares 3 with attribute 1).
COALITIONS = [np.array([0, 1]), np.array([2, 3]), np.array([3, 4])]


def _codes(on: list[list[int]], n_latents: int = 6) -> np.ndarray:
    codes = np.zeros((len(on), n_latents), dtype=bool)
    for row, latents in enumerate(on):
        codes[row, latents] = True
    return codes


def test_tapascore_hand_computed_with_shared_latent_and_removal_only_pair() -> None:
    before = _codes([[0], [2, 3], [1], []])
    after = _codes([[2], [3, 4], [1], []])
    added = np.array([1, 2, -1, 0])
    removed = np.array([0, 1, 0, 2])
    # Pair 0: I_add {2,3}: 1 - 0 = +1; I_rem {0,1}: 0 - 1 = -1.
    # Pair 1: latent 3 is in both coalitions and dropped: I_add {4}: 1 - 0 = +1; I_rem {2}: 0 - 1 = -1
    #         (keeping 3 would have given delta_rem = 1 - 1 = 0).
    # Pair 2: removal only (no add term); I_rem {0,1}: latent 1 stays on: 0.
    # Pair 3: nothing moves: 0 and 0.
    # Published ("drop_pair", the default): no added coalition is empty; pair 2 adds nothing, so delta_add is the mean
    # over the three pairs that add: 2/3; delta_rem over all four: -1/2. TAPAScore = 7/6.
    result = tapascore(before, after, added, removed, COALITIONS)
    assert isinstance(result, Tapas) and result.empty == "drop_pair"
    assert result.delta_add == pytest.approx(2 / 3, abs=1e-15) and result.delta_rem == -0.5
    assert result.score == pytest.approx(7 / 6, abs=1e-15)
    assert (result.n_pairs, result.n_add, result.n_rem, result.n_scored) == (4, 3, 4, 4)
    # "zero": every pair counts in both means, pair 2's missing add term as 0: delta_add = 2/4, TAPAScore = 1.
    zero = tapascore(before, after, added, removed, COALITIONS, empty="zero")
    assert zero.delta_add == 0.5 and zero.delta_rem == -0.5 and zero.score == 1.0
    # "skip": pair 2 has no add term, as published here: the same numbers.
    skipped = tapascore(before, after, added, removed, COALITIONS, empty="skip")
    assert skipped.delta_add == pytest.approx(2 / 3, abs=1e-15)
    assert skipped.delta_rem == -0.5
    assert skipped.score == pytest.approx(2 / 3 + 1 / 2, abs=1e-15)


def test_published_convention_drops_a_pair_whose_added_coalition_is_empty_by_hand() -> None:
    # Attribute 0 -> {0}; attribute 1 -> {} (matched to nothing); attribute 2 -> {2}; attribute 3 -> {3}.
    coalitions = [np.array([0]), np.array([], dtype=np.int64), np.array([2]), np.array([3])]
    before = _codes([[0, 3], [0, 3], [2, 3]])
    after = _codes([[2], [3], [0, 3]])
    added, removed = np.array([2, 1, 0]), np.array([0, 0, 2])
    present = np.array([[1, 0, 0, 1], [1, 0, 0, 1], [0, 0, 1, 1]], dtype=bool)
    # Pair 0: adds 2 (+1), removes 0 (-1); attribute 3 stays present: its latent 3 switches off (|delta| 1).
    # Pair 1: adds attribute 1, whose coalition is empty: published, the pair is left out of everything
    #         (its removal delta -1 and its stay delta 0 included).
    # Pair 2: adds 0 (+1), removes 2 (-1); attribute 3 stays on (0).
    # drop_pair: delta_add = (1 + 1) / 2 = 1, delta_rem = (-1 - 1) / 2 = -1, TAPAScore = 2; Delta-stay = (1 + 0) / 2.
    result = tapascore(before, after, added, removed, coalitions)
    assert (result.delta_add, result.delta_rem, result.score, result.n_scored) == (1.0, -1.0, 2.0, 2)
    assert delta_stay(before, after, present, added, removed, coalitions) == 0.5
    # zero: pair 1 counts, add 0 and remove -1: delta_add = 2/3, delta_rem = -1, TAPAScore = 5/3; Delta-stay (1 + 0 + 0) / 3.
    zero = tapascore(before, after, added, removed, coalitions, empty="zero")
    assert zero.score == pytest.approx(5 / 3, abs=1e-15) and zero.n_scored == 3
    assert delta_stay(before, after, present, added, removed, coalitions, empty="zero") == pytest.approx(1 / 3, abs=1e-15)
    # skip: pair 1 leaves the add mean only: delta_add = 1, delta_rem = -1, TAPAScore = 2.
    assert tapascore(before, after, added, removed, coalitions, empty="skip").score == 2.0


def test_removal_only_benchmark_scores_minus_mean_delta_rem() -> None:
    before = _codes([[0], [1], [2]])
    after = _codes([[], [1], []])
    for empty in ("drop_pair", "zero", "skip"):
        result = tapascore(before, after, np.full(3, -1), np.array([0, 0, 1]), COALITIONS, empty=empty)
        assert result.delta_rem == pytest.approx(-2 / 3, abs=1e-15)
        assert result.score == pytest.approx(2 / 3, abs=1e-15)
        assert result.n_add == 0
        assert result.delta_add == 0.0 if empty == "zero" else np.isnan(result.delta_add)


def test_perfect_edit_scores_two_and_identical_codes_score_zero() -> None:
    before = _codes([[0], [1, 5]])
    after = _codes([[2], [4, 5]])
    added, removed = np.array([1, 2]), np.array([0, 0])
    assert tapascore(before, after, added, removed, COALITIONS).score == 2.0
    assert tapascore(after, before, added, removed, COALITIONS).score == -2.0
    assert tapascore(before, before, added, removed, COALITIONS).score == 0.0


def test_empty_coalitions_under_each_convention() -> None:
    coalitions = [np.array([0]), np.array([], dtype=np.int64), np.array([0])]
    before = _codes([[0], [0]])
    after = _codes([[], []])
    # Pair 0 adds attribute 1 (empty coalition): its removal delta is -1. Pair 1: add and remove share their only
    # latent, so both sets are empty. zero: both pairs count, 0 where empty: TAPAScore = 0 - (-1 + 0) / 2.
    result = tapascore(before, after, np.array([1, 2]), np.array([0, 0]), coalitions, empty="zero")
    assert (result.n_add, result.n_rem) == (0, 1)
    assert result.score == 0.5
    # Skip: only pair 0's removal is a term.
    assert tapascore(before, after, np.array([1, 2]), np.array([0, 0]), coalitions, empty="skip").score == 1.0
    # drop_pair (published): both pairs add an attribute with an empty coalition: nothing is left to score.
    dropped = tapascore(before, after, np.array([1, 2]), np.array([0, 0]), coalitions)
    assert np.isnan(dropped.score) and "left out" in dropped.score.reason and dropped.n_scored == 0
    assert np.isnan(tapascore(before, after, np.array([1, -1]), np.array([-1, -1]), coalitions, empty="skip").score)
    assert np.isnan(tapascore(before, after, np.array([1, -1]), np.array([-1, -1]), coalitions).score)  # nothing matched
    with pytest.raises(ValueError, match="empty"):
        tapascore(before, after, np.array([1, 2]), np.array([0, 0]), coalitions, empty="drop")
    with pytest.raises(ValueError, match="empty"):
        delta_stay(before, after, np.ones((2, 3), dtype=bool), np.array([1, 2]), np.array([0, 0]), coalitions, empty="drop")


def test_tapascore_bounded_on_random_codes() -> None:
    rng = np.random.default_rng(0)
    coalitions = [rng.choice(30, size=rng.integers(1, 4), replace=False) for _ in range(8)]
    for _ in range(20):
        before = rng.random((50, 30)) < 0.2
        after = rng.random((50, 30)) < 0.2
        added = rng.integers(-1, 8, size=50)
        removed = rng.integers(0, 8, size=50)
        result = tapascore(before, after, added, removed, coalitions)
        assert -2.0 <= result.score <= 2.0
        assert -1.0 <= result.delta_add <= 1.0 and -1.0 <= result.delta_rem <= 1.0


def test_delta_stay_hand_computed() -> None:
    before = _codes([[0, 4], [0, 2]])
    after = _codes([[2], [0]])
    present = np.array([[True, False, True], [True, True, False]])
    added, removed = np.array([1, -1]), np.array([0, 1])
    # Pair 0: attribute 0 is the edit; attribute 2 {3,4}: on before (4), off after -> |delta| = 1.
    # Pair 1: attribute 1 is the edit; attribute 0 {0,1}: on before and after -> 0. Mean = 1/2.
    assert delta_stay(before, after, present, added, removed, COALITIONS) == 0.5
    assert delta_stay(before, before, present, added, removed, COALITIONS) == 0.0
    assert np.isnan(delta_stay(before, after, np.zeros((2, 3), dtype=bool), added, removed, COALITIONS))


def test_bad_inputs_raise_clear_errors() -> None:
    codes = _codes([[0], [1]])
    ok = np.array([0, 1])
    with pytest.raises(TypeError, match="bool"):
        tapascore(codes.astype(int), codes, ok, ok, COALITIONS)
    with pytest.raises(ValueError, match="after"):
        tapascore(codes, codes[:1], ok, ok, COALITIONS)
    with pytest.raises(ValueError, match="added"):
        tapascore(codes, codes, np.array([0, 3]), ok, COALITIONS)
    with pytest.raises(ValueError, match="removed"):
        tapascore(codes, codes, ok, np.array([0]), COALITIONS)
    with pytest.raises(TypeError, match="int"):
        tapascore(codes, codes, ok.astype(float), ok, COALITIONS)
    with pytest.raises(ValueError, match=r"coalitions\[0\]"):
        tapascore(codes, codes, ok, ok, [np.array([0, 6])] + COALITIONS[1:])
    with pytest.raises(ValueError, match="coalitions"):
        tapascore(codes, codes, ok, ok, [])
    with pytest.raises(ValueError, match="present"):
        delta_stay(codes, codes, np.ones((2, 2), dtype=bool), ok, ok, COALITIONS)
