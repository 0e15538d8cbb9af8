"""The explanations of one run (pipeline.explain.explanations): small synthetic inputs, hand-checked values."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.explain.explanations import (
    ExplainSettings,
    KindData,
    explain_rows,
    explain_run,
    frequent_latents,
    latent_labels,
    latent_list,
    switched_latents,
    top_activating,
)
from pipeline.explain.naming import LatentNames
from tests.conftest import CAPTIONS, COLOURS

# three images (rows) x four latents; latent 1 and 3 never fire
CODES = np.array([[1.0, 0.0, 2.0, 0.0],
                  [0.0, 0.0, 3.0, 0.0],
                  [2.0, 0.0, 0.0, 0.0]])


# --- small helpers ------------------------------------------------------------------------------------
def test_latent_labels_name_half_axes_plus_then_minus() -> None:
    assert latent_labels(2, signed=True) == ["+0", "+1", "-0", "-1"]
    assert latent_labels(3, signed=False) == ["0", "1", "2"]
    with pytest.raises(ValueError, match="n_latents"):
        latent_labels(0, signed=False)


def test_explain_rows_are_a_seeded_prefix_of_one_permutation() -> None:
    assert explain_rows(5, 3, seed=0).tolist() == np.random.default_rng(0).permutation(5)[:3].tolist()
    assert sorted(explain_rows(4, 10, seed=1).tolist()) == [0, 1, 2, 3]  # size >= n: every row
    assert explain_rows(9, 4, seed=2).tolist() == explain_rows(9, 9, seed=2)[:4].tolist()  # a larger size extends the same order
    with pytest.raises(ValueError, match="size"):
        explain_rows(5, 0, seed=0)


def test_frequent_latents_skip_dead_ones_and_break_ties_by_index() -> None:
    chosen, frequency = frequent_latents(CODES, 3)
    assert chosen.tolist() == [0, 2]  # both active on 2 of 3 images; 1 and 3 never
    np.testing.assert_allclose(frequency, [2 / 3, 0, 2 / 3, 0])
    assert frequent_latents(CODES, 1)[0].tolist() == [0]
    with pytest.raises(ValueError, match="non-negative"):
        frequent_latents(-CODES, 2)


def test_top_activating_rows_are_largest_first_and_active_only() -> None:
    assert top_activating(CODES, np.array([0, 2]), 2) == [[2, 0], [1, 0]]
    assert top_activating(CODES, np.array([0, 1]), 3) == [[2, 0], []]  # row 1 is inactive for latent 0


def test_latent_list_maps_positions_to_dataset_rows() -> None:
    names = LatentNames(names=np.array([["a", "b"], ["c", "d"], ["e", "f"], ["g", "h"]], dtype=object),
                        scores=np.array([[0.9, 0.5], [0.8, 0.1], [0.7, 0.6], [0.3, 0.2]], dtype=np.float32),
                        indices=np.zeros((4, 2), np.int64))
    listed = latent_list(CODES, np.array([10, 11, 12]), names, ["w", "x", "y", "z"], count=5, images=1)
    assert [entry["latent"] for entry in listed] == ["w", "y"]
    assert listed[0]["names"] == ["a", "b"] and listed[0]["scores"] == pytest.approx([0.9, 0.5])
    assert listed[0]["top_images"] == [12] and listed[1]["top_images"] == [11]
    assert listed[1]["frequency"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="rows"):
        latent_list(CODES, np.array([10, 11]), names, ["w", "x", "y", "z"], count=5, images=1)


def test_switched_latents_list_on_and_off_by_strength() -> None:
    before = np.array([[1.0, 0.0, 0.5, 0.0]])
    after = np.array([[0.0, 2.0, 0.5, 3.0]])
    labels, best = ["+0", "+1", "-0", "-1"], ["red", "blue", "round", "flat"]
    (pair,) = switched_latents(before, after, labels, best, limit=8)
    assert pair["on"] == [{"latent": "-1", "name": "flat"}, {"latent": "+1", "name": "blue"}]  # 3.0 before 2.0; -0 stayed on
    assert pair["off"] == [{"latent": "+0", "name": "red"}]
    assert switched_latents(before, after, labels, best, limit=1)[0]["on"] == [{"latent": "-1", "name": "flat"}]
    assert switched_latents(before, before, labels, best, limit=2) == [{"on": [], "off": []}]
    with pytest.raises(ValueError, match="after"):
        switched_latents(before, after[:, :3], labels, best, limit=1)


# --- a whole run, hand-checkable (the `identity_run` fixture of conftest.py) ------------------------------------
def test_explain_run_names_scores_and_captions_hand_checked(identity_run: dict) -> None:
    e = explain_run(identity_run["model"], 1, identity_run["decoder"], [identity_run["kind"]], identity_run["concepts"], identity_run["b"], identity_run["settings"])
    assert (e["k"], e["signed"], e["n_latents"], e["named"]) == (1, True, 8, True)
    # +j fires on image j only (frequency 1/4 each), -j never: four listed latents, named by colour j first
    assert [entry["latent"] for entry in e["latents"]] == ["+0", "+1", "+2", "+3"]
    assert [entry["names"][0] for entry in e["latents"]] == COLOURS
    assert [entry["top_images"] for entry in e["latents"]] == [[40], [41], [42], [43]]
    assert all(entry["frequency"] == 0.25 for entry in e["latents"])
    # centred concepts e_i - 1/4: cos(+e_j, e_j - 1/4) = 0.75 / sqrt(0.75) = sqrt(0.75)
    assert e["latents"][0]["scores"][0] == pytest.approx(np.sqrt(0.75), abs=1e-6)
    # model: one named concept per image, always right; dense (top 2): the right one and a wrong one
    assert e["relevance"]["objects"] == {"m": 2, "model": {"precision": 1.0, "recall": 1.0, "n_images": 4, "n_empty": 0},
                                         "dense": {"precision": 0.5, "recall": 1.0, "n_images": 4, "n_empty": 0}}
    assert e["describes"]["objects"] == {"n_images": 4, "k": 1, "dense": 1.0, "sparse": 1.0, "topk_original": 1.0,
                                         "attribute_precision": {"dense": 1.0, "sparse": 1.0, "topk_original": 1.0}}
    # k = 9 > d is skipped; k = 1 (the run's) and 2 are captioned from both sparse sources
    assert sorted({(p["k"], p["source"]) for p in e["describes_curve"]}) == [(1, "sparse"), (1, "topk_original"), (2, "sparse"), (2, "topk_original")]
    first = e["examples"][0]
    assert len(e["examples"]) == 2 and first["row"] == 40 and first["attributes"] == ["red"]
    assert first["concepts"] == [["red", 1.0]] and first["dense_concepts"][0][0] == "red"
    assert first["captions"] == {"dense": "a red thing", "sparse": "a red thing", "topk_original": "a red thing"}
    assert first["describes"] == {"dense": True, "sparse": True, "topk_original": True}
    assert e["pairs"] == [{"kind": "objects", "pair": 7, "edit": "red → green", "on": [{"latent": "+1", "name": "green"}],
                           "off": [{"latent": "+0", "name": "red"}]}]
    json.dumps(e, allow_nan=False)  # strict JSON


def test_explain_run_without_a_concept_vocabulary_still_captions(identity_run: dict) -> None:
    e = explain_run(identity_run["model"], 1, identity_run["decoder"], [identity_run["kind"]], None, identity_run["b"], identity_run["settings"])
    assert e["named"] is False and e["relevance"] == {}
    assert all(entry["names"] == [] for entry in e["latents"])
    assert e["describes"]["objects"]["dense"] == 1.0 and e["examples"][0]["concepts"] == []


def test_explain_run_errors_are_clear(identity_run: dict) -> None:
    args = (identity_run["decoder"], [identity_run["kind"]], identity_run["concepts"], identity_run["b"], identity_run["settings"])
    with pytest.raises(ValueError, match="k: expected an int in 1..4"):
        explain_run(identity_run["model"], 5, *args)
    with pytest.raises(ValueError, match="image_mean"):
        explain_run(identity_run["model"], 1, identity_run["decoder"], [identity_run["kind"]], identity_run["concepts"], identity_run["b"][:3], identity_run["settings"])
    with pytest.raises(ValueError, match="kinds"):
        explain_run(identity_run["model"], 1, identity_run["decoder"], [], identity_run["concepts"], identity_run["b"], identity_run["settings"])
    with pytest.raises(ValueError, match="attributes: expected bool"):
        KindData(kind="objects", rows=np.array([0]), x=np.zeros((1, 4), np.float32), attributes=np.zeros((1, 2), int),
                 attribute_names=["a", "b"], families={}, phrases=[["a"], ["b"]], truth=["t"], scored=True)
    with pytest.raises(ValueError, match="top_m"):
        ExplainSettings(top_m=0)


def test_captions_of_a_complete_kind_are_judged_against_every_column(identity_run: dict) -> None:
    """A caption stating another kind's attribute ("tree") is wrong on a kind whose labels are complete."""
    kind = identity_run["kind"]
    judged = KindData(kind="objects", rows=kind.rows, x=kind.x, attributes=kind.attributes, attribute_names=COLOURS, families=kind.families,
                      phrases=kind.phrases, truth=CAPTIONS, scored=True, caption_attributes=np.eye(4, 5, dtype=bool),
                      caption_names=COLOURS + ["thing"], caption_phrases=[[c] for c in COLOURS] + [["thing"]])
    e = explain_run(identity_run["model"], 1, identity_run["decoder"], [judged], None, identity_run["b"], identity_run["settings"])
    assert e["describes"]["objects"]["dense"] == 0.0  # "a red thing" states "thing", false on every image
    assert e["describes"]["objects"]["attribute_precision"]["dense"] == 0.5  # ... and its colour, true
