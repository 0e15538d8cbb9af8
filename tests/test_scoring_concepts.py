"""pipeline.scoring.concepts: concept metrics of a model against its untrained twin and random codes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from pipeline.metrics.matching import binarise, coalition_f1, fbmp, nan_mean
from pipeline.models.registry import build
from pipeline.scoring.codes import ArrayCodes, bernoulli_csr
from pipeline.scoring.concepts import (
    ConceptData,
    EvaluateSettings,
    ProbeStream,
    VariantCodes,
    concept_metrics,
    fit_family_probes,
    matching_scores,
    random_variant,
)


def test_random_codes_follow_the_given_frequencies_and_do_not_depend_on_what_else_is_read():
    frequency = np.array([0.0, 0.5, 1.0, 0.01])
    codes = random_variant(frequency, seed=0).match.codes(np.arange(20_000))
    observed = np.bincount(codes.indices, minlength=4) / codes.shape[0]
    assert observed[0] == 0 and observed[2] == 1 and abs(observed[1] - 0.5) < 0.02 and abs(observed[3] - 0.01) < 0.003
    some = random_variant(frequency, seed=0).match.codes(np.array([19_999, 7, 4096]))
    np.testing.assert_array_equal(some.toarray(), codes[[19_999, 7, 4096]].toarray())
    other_stream = random_variant(frequency, seed=0).test.codes(np.arange(20_000))
    assert (other_stream != codes).nnz > 0, "each row set draws its own stream"


def test_bernoulli_sampler_is_exact_in_distribution():
    """Per-entry independence: the number of active latents per row of 16 latents at p = 0.25 is Binomial(16, 1/4)."""
    counts = np.diff(bernoulli_csr(np.random.default_rng(1), 40_000, np.full(16, 0.25)).indptr)
    observed = np.bincount(counts, minlength=17)[:17] / len(counts)
    from scipy.stats import binom
    np.testing.assert_allclose(observed, binom.pmf(np.arange(17), 16, 0.25), atol=0.006)


def toy(n: int = 600, seed: int = 0) -> tuple[ConceptData, np.ndarray, np.ndarray]:
    """Embeddings whose coordinates are the attributes themselves (plus noise): identity-aligned concepts. Rows
    0..n/2 are the matching rows, the rest the test rows; 40 pairs move one coordinate to the next."""
    rng = np.random.default_rng(seed)
    family = rng.integers(0, 4, size=n)
    y = np.eye(4, dtype=bool)[family]
    x = (y * 2.0 + 0.05 * rng.normal(size=(n, 4))).astype(np.float32)
    before = np.eye(4, dtype=np.float32)[np.arange(40) % 4] * 2
    after = np.eye(4, dtype=np.float32)[(np.arange(40) + 1) % 4] * 2
    rows = np.arange(n)
    data = ConceptData(
        match_rows=rows[: n // 2], test_rows=rows[n // 2 :], pool_rows=rows[n // 2 :], labels=lambda r: y[r], embeddings=lambda r: x[r],
        families={"f": [0, 1, 2, 3]}, pair_ids=np.arange(40), pairs_present=before > 0,
        pairs_added=(np.arange(40) + 1) % 4, pairs_removed=np.arange(40) % 4, pairs_family=np.array(["f"] * 40),
    )
    return data, x, np.stack([before, after])


def variant(model, data: ConceptData, x: np.ndarray, pairs: np.ndarray, probes) -> VariantCodes:
    """The codes of `model` held in memory, and its probe scores streamed over the test rows in 3 blocks."""
    every = ArrayCodes(np.arange(len(x)), model.sparse_latents(x))
    stream = ProbeStream(probes, data)
    for block in np.array_split(data.test_rows, 3):
        stream.add(block, x[block], model(torch.as_tensor(x[block])).detach().numpy())
    pair_ids = np.arange(len(pairs[0]))
    return VariantCodes(every, every, ArrayCodes(pair_ids, model.sparse_latents(pairs[0])), ArrayCodes(pair_ids, model.sparse_latents(pairs[1])),
                        stream.result())


def test_tapascore_per_edited_family_by_hand():
    """Pairs of family "moved" follow their edit (TAPAScore 2 each, the identity's aligned axes); pairs of family
    "frozen" have after = before (0 each): the families score 2 and 0, all pairs together their mean, 1."""
    from dataclasses import replace

    data, x, pairs = toy()
    frozen = np.arange(40) % 2 == 1
    pairs[1][frozen] = pairs[0][frozen]
    data = replace(data, pairs_family=np.where(frozen, "frozen", "moved"))
    model = build("identity", 4, 4, 1)
    model.fit_init(torch.as_tensor(x[data.match_rows]))
    probes = fit_family_probes(data, seed=0, max_n=20_000)
    settings = EvaluateSettings(cknna_max_n=200, fms_max_n=200, batch_size=64)
    tapas = concept_metrics(variant(model, data, x, pairs, probes), variant(model, data, x, pairs, probes), data, settings, seed=0).trained.tapas
    assert tapas.overall.score == pytest.approx(1.0) and tapas.overall.n_pairs == 40
    assert {f: (v.score, v.n_pairs) for f, v in tapas.families.items()} == {"moved": (2.0, 20), "frozen": (0.0, 20)}


def test_aligned_axes_match_perfectly_and_respond_to_edits():
    data, x, pairs = toy()
    model = build("identity", 4, 4, 1)
    model.fit_init(torch.as_tensor(x[data.match_rows]))
    twin = build("random_rotation", 4, 4, 1, seed=3)
    twin.fit_init(torch.as_tensor(x[data.match_rows]))
    probes = fit_family_probes(data, seed=0, max_n=20_000)
    settings = EvaluateSettings(cknna_max_n=200, fms_max_n=200, batch_size=64)
    result = concept_metrics(variant(model, data, x, pairs, probes), variant(twin, data, x, pairs, probes), data, settings, seed=0)
    trained = result.trained
    # each attribute is exactly "coordinate a is the largest": its +a half-axis fires iff the attribute holds
    assert trained.match_score == pytest.approx(1.0)
    assert trained.matching.fbmp[0.5][3].test == pytest.approx(1.0)
    assert trained.tapas.overall.score == pytest.approx(2.0)
    assert np.isnan(trained.delta_stay), "one family: no attribute stays present outside the edit"
    assert result.random.tapas.overall.score < 0.5
    assert result.delta_match_score == pytest.approx(1.0 - result.untrained.match_score)
    assert result.delta_matching.fbmp[0.5][3] == result.delta_match_score
    assert result.delta_matching.one_to_one == pytest.approx(trained.matching.one_to_one.match - result.untrained.matching.one_to_one.match)
    assert trained.probe.kl >= 0 and result.random.probe is None
    # the diagnostic on each row's strongest activations: at k = 1 the codes are already that, so it equals MATCHScore
    assert trained.match_strongest == pytest.approx(trained.match_score)
    assert result.delta_match_strongest == pytest.approx(trained.match_strongest - result.untrained.match_strongest)
    assert result.random.match_strongest is None, "random codes have no strength to rank"
    off = concept_metrics(variant(model, data, x, pairs, probes), variant(twin, data, x, pairs, probes), data,
                          EvaluateSettings(cknna_max_n=200, fms_max_n=200, batch_size=64, match_strongest=None), seed=0)
    assert off.trained.match_strongest is None and off.delta_match_strongest is None
    assert set(trained.matching.fbmp) == {0.25, 0.5, 1.0} and set(trained.matching.fbmp[0.5]) == set(settings.match_ks)


def test_held_out_scores_streamed_in_blocks_equal_one_pass():
    data, x, pairs = toy(n=500, seed=2)
    model = build("pca", 4, 4, 2)
    model.fit_init(torch.as_tensor(x[data.match_rows]))
    codes = variant(model, data, x, pairs, None)
    settings = EvaluateSettings(batch_size=17)  # many blocks, the last one short
    scores, _ = matching_scores(codes, data, settings)
    active_match = binarise(codes.match.codes(data.match_rows))
    active_test = binarise(codes.test.codes(data.test_rows))
    y_test = data.labels(data.test_rows)
    for beta in settings.betas:
        m = fbmp(active_match, data.y_match, beta=beta, k=max(settings.match_ks))
        for k in settings.match_ks:
            assert scores.fbmp[beta][k].test == nan_mean(coalition_f1(active_test, y_test, [c[:k] for c in m.coalitions]))
            # in-sample: FBMP's own score with that k (the largest k's running counts, no second pass)
            assert scores.fbmp[beta][k].match == fbmp(active_match, data.y_match, beta=beta, k=k).score
    one = dataclasses.replace(settings, batch_size=10_000)
    assert matching_scores(codes, data, one)[0] == scores


def test_the_betas_matched_side_by_side_on_threads_give_one_threads_scores(monkeypatch):
    """The FBMP rules of the betas run on the process's threads (and the strongest-activation diagnostic of both
    models): one thread or three, the same scores and coalitions."""
    data, x, pairs = toy(n=500, seed=4)
    model = build("pca", 4, 4, 2)
    model.fit_init(torch.as_tensor(x[data.match_rows]))
    twin = build("random_rotation", 4, 4, 2, seed=1)
    twin.fit_init(torch.as_tensor(x[data.match_rows]))
    settings = EvaluateSettings(cknna_max_n=200, fms_max_n=200, batch_size=64)
    results = []
    for threads in ("1", "3"):
        monkeypatch.setenv("OMP_NUM_THREADS", threads)
        results.append(concept_metrics(variant(model, data, x, pairs, None), variant(twin, data, x, pairs, None), data, settings, seed=0))
    one, three = results
    assert repr(one) == repr(three)  # every number (NaN where undefined: repr compares them) and coalition
    assert one.trained.match_strongest is not None and len(one.trained.matching.fbmp) == 3


def test_probe_stream_equals_the_probe_on_all_test_rows_at_once():
    from pipeline.metrics.probe import probe_scores

    data, x, pairs = toy(n=400, seed=3)
    model = build("pca", 4, 4, 1)
    model.fit_init(torch.as_tensor(x[data.match_rows]))
    probes = fit_family_probes(data, seed=0, max_n=20_000)
    streamed = variant(model, data, x, pairs, probes).probe
    rows = data.test_rows
    (once,) = probe_scores(probes, x[rows], model(torch.as_tensor(x[rows])).detach().numpy(), np.argmax(data.labels(rows), axis=1))
    for field in ProbeStream.FIELDS:
        assert getattr(streamed, field) == pytest.approx(getattr(once, field), rel=1e-12, abs=1e-12)


def test_the_probes_are_fitted_on_a_seeded_subsample_of_at_most_probe_max_n_matching_rows():
    from pipeline.data.dataset import sample_rows
    from pipeline.metrics.probe import fit_probes

    data, x, _ = toy()
    keep = sample_rows(np.arange(len(data.match_rows)), 40, 0)
    expected = fit_probes(x[data.match_rows[keep]], np.argmax(data.labels(data.match_rows[keep]), axis=1)[:, None])
    assert torch.equal(fit_family_probes(data, seed=0, max_n=40).weight, expected.weight)
    every = fit_family_probes(data, seed=0, max_n=len(data.match_rows))
    assert not torch.equal(every.weight, expected.weight)
    assert torch.equal(fit_family_probes(data, seed=0, max_n=10**6).weight, every.weight)


def test_cknna_of_every_variant_against_the_embeddings_read_and_kerneled_once():
    """The embeddings' side of CKNNA is computed once per kind and shared by the trained, untrained and random codes:
    each variant's CKNNA is exactly `cknna` of its pool codes (the seeded subsample of cknna_max_n rows) against the
    embeddings of those rows, and the embeddings are read once."""
    from dataclasses import replace

    from pipeline.metrics.cknna import cknna, cknna_subsample
    from pipeline.metrics.csr import column_counts

    data, x, pairs = toy(n=600, seed=5)
    reads = []
    data = replace(data, embeddings=lambda rows: reads.append(len(rows)) or x[rows])
    model = build("pca", 4, 4, 2)
    model.fit_init(torch.as_tensor(x[data.match_rows]))
    twin = build("random_rotation", 4, 4, 2, seed=1)
    twin.fit_init(torch.as_tensor(x[data.match_rows]))
    settings = EvaluateSettings(cknna_max_n=150, cknna_k=5, fms_max_n=200, batch_size=64)
    trained, untrained = variant(model, data, x, pairs, None), variant(twin, data, x, pairs, None)
    result = concept_metrics(trained, untrained, data, settings, seed=3)
    assert reads == [150]
    near = data.pool_rows[cknna_subsample(len(data.pool_rows), 150, 3)]
    frequency = column_counts(binarise(trained.match.codes(data.match_rows))) / len(data.match_rows)
    for got, codes in ((result.trained, trained), (result.untrained, untrained), (result.random, random_variant(frequency, 3))):
        assert got.cknna == cknna(codes.test.codes(near), x[near], k=5, max_n=None)
    assert result.trained.cknna != result.untrained.cknna


def test_each_variants_fms_is_fms_of_its_pool_codes_alone():
    """The trained, untrained and random codes' FMS grow together (`fms_of_sets`): each variant's is exactly `fms` of
    its codes of the pool rows, on its own."""
    from pipeline.metrics.csr import column_counts
    from pipeline.metrics.fms import fms

    data, x, pairs = toy(n=600, seed=6)
    model = build("pca", 4, 4, 2)
    model.fit_init(torch.as_tensor(x[data.match_rows]))
    twin = build("random_rotation", 4, 4, 2, seed=2)
    twin.fit_init(torch.as_tensor(x[data.match_rows]))
    settings = EvaluateSettings(cknna_max_n=150, fms_max_n=200, batch_size=64, fms_removals=(1, 2))
    trained, untrained = variant(model, data, x, pairs, None), variant(twin, data, x, pairs, None)
    result = concept_metrics(trained, untrained, data, settings, seed=4)
    frequency = column_counts(binarise(trained.match.codes(data.match_rows))) / len(data.match_rows)
    for got, codes in ((result.trained, trained), (result.untrained, untrained), (result.random, random_variant(frequency, 4))):
        alone = fms(codes.test.codes(data.pool_rows), data.y_pool, max_n=200, seed=4, removals=(1, 2))
        assert got.fms == alone.fms
    assert result.trained.fms != result.random.fms
