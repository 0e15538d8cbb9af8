"""A latent's card numbers (pipeline.explain.cards): activations on its top images, its histogram, its best-matching
attribute and the noise floor of the naming, by hand and as properties; and through `explain_run`."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import sparse

from pipeline.explain.cards import activation_stats, best_attributes, naming_floor
from pipeline.explain.explanations import explain_run
from pipeline.explain.naming import name_latents

CODES = np.array([[0.0, 2.0, 0.5],
                  [1.0, 0.0, 0.5],
                  [4.0, 1.0, 0.0],
                  [0.0, 0.0, 0.0]], dtype=np.float32)


def test_activation_stats_by_hand() -> None:
    stats = activation_stats(sparse.csr_array(CODES), np.array([0, 2]), [[2, 1], [0]], bins=4)
    assert stats[0]["top_values"] == [4.0, 1.0] and stats[1]["top_values"] == [0.5]
    assert stats[0]["histogram"] == {"max": 4.0, "counts": [0, 1, 0, 1]}  # 1 -> bin 1 of [0, 4); 4 -> the last bin
    assert stats[1]["histogram"] == {"max": 0.5, "counts": [0, 0, 0, 2]}
    with pytest.raises(ValueError, match="tops"):
        activation_stats(CODES, np.array([0]), [[0], [1]])


def test_activation_histogram_counts_every_active_row() -> None:
    codes = np.random.default_rng(0).exponential(size=(200, 30)) * (np.random.default_rng(1).random((200, 30)) < 0.2)
    latents = np.arange(30)
    stats = activation_stats(codes.astype(np.float32), latents, [[] for _ in latents], bins=7)
    assert [sum(s["histogram"]["counts"]) for s in stats] == (codes > 0).sum(axis=0).tolist()
    assert [s["histogram"]["max"] for s in stats] == pytest.approx(codes.max(axis=0).tolist())


def test_best_attributes_by_hand() -> None:
    labels = np.array([[1, 0], [1, 1], [0, 1], [0, 0]], dtype=bool)
    column, f1 = best_attributes(CODES > 0, labels, np.array([0, 1, 2]))
    # latent 0 fires on rows 1, 2: F1 against a0 (rows 0, 1) = 2*1/4, against a1 (rows 1, 2) = 1
    # latent 1 fires on rows 0, 2: 0.5 against both (tie: the lower column); latent 2 on rows 0, 1 = a0 exactly
    assert column.tolist() == [1, 0, 0] and f1.tolist() == [1.0, 0.5, 1.0]
    never = best_attributes(np.zeros((4, 2), bool), labels, np.array([0, 1]))
    assert never[1].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="labels"):
        best_attributes(CODES > 0, labels[:3], np.array([0]))


def test_naming_floor_is_the_best_cosine_of_random_directions() -> None:
    rng = np.random.default_rng(0)
    concepts = rng.standard_normal((50, 16)).astype(np.float32)
    texts = [f"c{i}" for i in range(50)]
    floor = naming_floor(concepts, texts, concepts.mean(axis=0), n=500, seed=3)
    assert floor["n"] == 500 and 0 < floor["mean"] <= floor["p95"] <= floor["max"] <= 1
    assert floor == naming_floor(concepts, texts, concepts.mean(axis=0), n=500, seed=3)  # seeded
    # a concept's own direction scores 1, far above the floor of random ones
    own = name_latents(concepts[:1] - concepts.mean(axis=0), concepts, texts, top=1, text_mean=concepts.mean(axis=0))
    assert own.scores[0, 0] == pytest.approx(1.0, abs=1e-6) and floor["p95"] < 0.9


def test_explain_run_records_the_card_numbers(identity_run: dict) -> None:
    e = explain_run(identity_run["model"], 1, identity_run["decoder"], [identity_run["kind"]], identity_run["concepts"], identity_run["b"],
                    identity_run["settings"])
    first = e["latents"][0]  # +0: fires on image 40 (= b + e_0) with activation 1, which is labelled red
    assert first["top_values"] == [pytest.approx(1.0)] and sum(first["histogram"]["counts"]) == 1
    assert first["matches"] == {"objects": ["red", 1.0]}
    assert set(e["naming_floor"]) == {"n", "mean", "p95", "max"}
