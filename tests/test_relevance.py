"""Relevance of named concepts and the "describes the image" rate of captions (pipeline.explain.relevance)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.data.phrases import name_phrases, words
from pipeline.data.world.scenes import generate_multi, generate_objects
from pipeline.data.world.texts import attribute_phrases
from pipeline.data.world.vocabulary import object_attribute_names
from pipeline.explain.relevance import describes_image_rate, normalise_phrases, relevance, stated_attributes

NAMES = ["red body", "circle shape", "grass background", "blue body"]
ATTRIBUTES = np.array([
    [True, True, True, False],     # a red circle on grass
    [False, True, False, True],    # a blue circle
    [False, False, False, False],  # nothing annotated
])
EXPLANATIONS = [
    [("red body", 0.9), ("dog", 0.8), ("circle shape", 0.7), ("blue body", 0.1)],
    [("blue body", 1.0), ("blue body", 0.5)],
    [],
]


# --- relevance --------------------------------------------------------------------------------------
def test_relevance_hand_computed_m3() -> None:
    result = relevance(EXPLANATIONS, ATTRIBUTES, NAMES, m=3)
    # precision: 2/3 (dog is wrong), 2/2, 0 (empty); recall: 2/3, 1/2, image 3 has no true attribute (left out)
    assert result.precision == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert result.recall == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert (result.n_images, result.n_empty) == (3, 1)


def test_relevance_hand_computed_m1_and_bounds() -> None:
    result = relevance(EXPLANATIONS, ATTRIBUTES, NAMES, m=1)
    assert result.precision == pytest.approx(2 / 3)
    assert result.recall == pytest.approx((1 / 3 + 1 / 2) / 2)
    for m in (1, 2, 4, 10):
        r = relevance(EXPLANATIONS, ATTRIBUTES, NAMES, m=m)
        assert 0.0 <= r.precision <= 1.0 and 0.0 <= r.recall <= 1.0


def test_relevance_recall_grows_with_m_and_perfect_explanations_score_one() -> None:
    recalls = [relevance(EXPLANATIONS, ATTRIBUTES, NAMES, m=m).recall for m in (1, 2, 3, 4)]
    assert recalls == sorted(recalls)
    perfect = [[(NAMES[j], 1.0) for j in np.flatnonzero(row)] for row in ATTRIBUTES[:2]]
    result = relevance(perfect, ATTRIBUTES[:2], NAMES, m=5)
    assert (result.precision, result.recall) == (1.0, 1.0)


def test_relevance_without_true_attributes_has_nan_recall() -> None:
    result = relevance([[("dog", 1.0)]], np.zeros((1, 4), bool), NAMES, m=2)
    assert result.precision == 0.0 and np.isnan(result.recall)


def test_relevance_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="attributes: expected 2 rows"):
        relevance(EXPLANATIONS[:2], ATTRIBUTES, NAMES, m=3)
    with pytest.raises(TypeError, match="attributes: expected a bool"):
        relevance(EXPLANATIONS, ATTRIBUTES.astype(int), NAMES, m=3)
    with pytest.raises(ValueError, match="attribute_names: expected 4"):
        relevance(EXPLANATIONS, ATTRIBUTES, NAMES[:3], m=3)
    with pytest.raises(ValueError, match="m: expected"):
        relevance(EXPLANATIONS, ATTRIBUTES, NAMES, m=0)
    with pytest.raises(ValueError, match="empty list"):
        relevance([], np.zeros((0, 4), bool), NAMES, m=1)


# --- parsing captions -------------------------------------------------------------------------------
def test_words_keep_hyphenated_words() -> None:
    assert words("A medium-sized Star, on a lawn; it's big.") == ["a", "medium-sized", "star", "on", "a", "lawn", "it's", "big"]


def test_name_phrases_are_the_name_and_its_distinctive_words() -> None:
    assert name_phrases(["red car", "blue car", "tree"]) == [["red car", "red"], ["blue car", "blue"], ["tree"]]
    # the world's phrases: value words and caption synonyms for object attributes, the generic rule for categories
    world = attribute_phrases(["striped pattern", "grass background", "tree"])
    assert world[0] == ["striped", "stripy"] and "lawn" in world[1] and "on a lawn" in world[1] and world[2] == ["tree"]


def _object_image(*names: str) -> np.ndarray:
    all_names = object_attribute_names()
    row = np.zeros(len(all_names), dtype=bool)
    row[[all_names.index(n) for n in names]] = True
    return row


def test_describes_image_hand_cases() -> None:
    captions = [
        "a red circle on a lawn",                        # 3 stated, all true
        "a blue circle in a blue sky",                   # "blue" = body, "blue sky" = sky background: 3 true
        "a red circle under the night sky",              # night is false (the image has sky): not "sky" twice
        "a dog in a photo",                              # states nothing
        "a big stripy square with a pointy white head",  # synonyms: large, striped, pointed; white top
    ]
    attributes = np.stack([
        _object_image("red body", "circle shape", "grass background"),
        _object_image("blue body", "circle shape", "sky background"),
        _object_image("red body", "circle shape", "sky background"),
        _object_image("red body", "circle shape", "sky background"),
        _object_image("large object", "striped pattern", "square shape", "pointed top", "white top"),
    ])
    result = describes_image_rate(captions, attributes, object_attribute_names(), attribute_phrases(object_attribute_names()))
    assert result.stated.tolist() == [3, 3, 3, 0, 5]
    assert result.correct.tolist() == [3, 3, 2, 0, 5]
    assert result.describes.tolist() == [True, True, False, False, True]
    assert result.rate == pytest.approx(3 / 5)
    names = object_attribute_names()
    assert result.stated_matrix[2, names.index("night background")] and not result.stated_matrix[2, names.index("sky background")]


def test_scene_captions_state_exactly_their_attributes() -> None:
    scenes = generate_objects(120, image_size=32, seed=3)
    result = describes_image_rate(scenes.captions, scenes.attributes, scenes.attribute_names, attribute_phrases(scenes.attribute_names))
    np.testing.assert_array_equal(result.stated_matrix, scenes.attributes)
    assert result.rate == 1.0 and (result.stated == 7).all()
    shifted = describes_image_rate(scenes.captions[1:] + scenes.captions[:1], scenes.attributes, scenes.attribute_names,
                                   attribute_phrases(scenes.attribute_names))
    assert shifted.rate <= 0.05 and (shifted.stated == 7).all()


def test_multi_scene_captions_state_exactly_their_categories() -> None:
    scenes = generate_multi(60, image_size=32, seed=2, max_objects=4)
    stated = stated_attributes(scenes.captions, normalise_phrases(attribute_phrases(scenes.attribute_names), 12))
    np.testing.assert_array_equal(stated, scenes.attributes)
    result = describes_image_rate(["a ball and a car"], np.eye(12, dtype=bool)[:1], scenes.attribute_names, attribute_phrases(scenes.attribute_names))
    assert (result.stated[0], result.correct[0], result.rate) == (2, 1, 0.0)


def test_describes_errors_are_clear() -> None:
    names = object_attribute_names()
    phrases = attribute_phrases(names)
    with pytest.raises(ValueError, match="captions: expected at least one"):
        describes_image_rate([], np.zeros((0, 34), bool), names, phrases)
    with pytest.raises(ValueError, match="attributes: expected 2 rows"):
        describes_image_rate(["a", "b"], np.zeros((1, 34), bool), names, phrases)
    with pytest.raises(TypeError, match=r"captions\[1\]"):
        describes_image_rate(["a", 3], np.zeros((2, 34), bool), names, phrases)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="attribute_names: expected at least one"):
        describes_image_rate(["a"], np.zeros((1, 0), bool), [], [])
    with pytest.raises(ValueError, match="phrases: expected one list of phrases per attribute"):
        describes_image_rate(["a"], np.zeros((1, 34), bool), names, phrases[:3])
