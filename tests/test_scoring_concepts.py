"""pipeline.scoring.concepts: concept metrics of a model against its untrained twin and random codes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.metrics.matching import fbmp
from pipeline.models import build
from pipeline.scoring.concepts import ConceptData, EvaluateSettings, concept_metrics, prefix_scores, random_codes


def test_prefix_scores_equal_fbmp_with_smaller_k():
    rng = np.random.default_rng(0)
    active = rng.random((300, 20)) < 0.2
    labels = rng.random((300, 4)) < 0.3
    full = fbmp(active, labels, beta=0.5, k=5)
    scores = prefix_scores(active, labels, full, (1, 2, 3, 5))
    for k in (1, 2, 3, 5):
        assert scores[k] == pytest.approx(fbmp(active, labels, beta=0.5, k=k).score)


def test_random_codes_follow_the_given_frequencies():
    data = toy_data(n=4000)
    codes = random_codes(np.array([0.0, 0.5, 1.0]), data, seed=0)
    freq = (codes.match > 0).mean(axis=0)
    assert freq[0] == 0 and freq[2] == 1 and abs(freq[1] - 0.5) < 0.03
    assert codes.reconstruction_test is None


def toy_data(n: int = 600, seed: int = 0) -> ConceptData:
    """Embeddings whose coordinates are the attributes themselves (plus noise): identity-aligned concepts."""
    rng = np.random.default_rng(seed)
    family = rng.integers(0, 4, size=n)
    y = np.eye(4, dtype=bool)[family]
    x = (y * 2.0 + 0.05 * rng.normal(size=(n, 4))).astype(np.float32)
    before = np.eye(4, dtype=np.float32)[np.arange(40) % 4] * 2
    after = np.eye(4, dtype=np.float32)[(np.arange(40) + 1) % 4] * 2
    return ConceptData(
        x_match=x[: n // 2], y_match=y[: n // 2], x_test=x[n // 2 :], y_test=y[n // 2 :], families={"f": [0, 1, 2, 3]},
        pairs_before=before, pairs_after=after, pairs_present=before > 0,
        pairs_added=(np.arange(40) + 1) % 4, pairs_removed=np.arange(40) % 4,
    )


def test_aligned_axes_match_perfectly_and_respond_to_edits():
    data = toy_data()
    model = build("identity", 4, 4, 1)
    model.fit_init(torch.as_tensor(data.x_match))
    twin = build("random_rotation", 4, 4, 1, seed=3)
    twin.fit_init(torch.as_tensor(data.x_match))
    result = concept_metrics(model, twin, data, EvaluateSettings(cknna_max_n=200, fms_max_n=200), seed=0)
    trained = result["trained"]
    # each attribute is exactly "coordinate a is the largest": its +a half-axis fires iff the attribute holds
    assert trained["match_score"] == pytest.approx(1.0)
    assert trained["tapas"]["score"] == pytest.approx(2.0)
    assert np.isnan(trained["delta_stay"]), "one family: no attribute stays present outside the edit"
    assert result["random"]["tapas"]["score"] < 0.5
    assert result["delta_match_score"] == pytest.approx(1.0 - result["untrained"]["match_score"])
    assert trained["probe"]["kl"] >= 0 and result["random"]["probe"] is None
    assert set(trained["matching"]) == {"fbmp_b0.25", "fbmp_b0.5", "fbmp_b1", "one_to_one"}
