"""Concept-level evaluation of one sparse model against its sanity-check baselines (no I/O of its own).

For a trained model, its untrained twin (same method, size, seed; data-dependent init only,
same sparsifier) and random codes, on data with binary attribute labels:

- matching: FBMP for every beta in `betas` (coalitions up to max(ks) latents; FBMP's stop rule
  does not depend on k, so the coalition for k is the first k latents of that one) and one-to-one.
  Coalitions are fitted on the *matching* rows (training split) and scored (F1 of their OR) both
  there (MATCHScore, as published) and on held-out *test* rows;
- Delta-MATCHScore = MATCHScore(trained) - MATCHScore(untrained), per matching rule;
- TAPAScore and Delta-stay on intervention pairs, with the FBMP (beta = 0.5, k = 3) coalitions;
- CKNNA between latent codes and the embeddings, FMS of the codes against the attributes,
  and the linear-probe cross-entropy/KL of reconstructions (one probe per attribute family).

Sizes (what memory grows with): codes are sparse everywhere (`pipeline.scoring.codes`: read from the code sets
the evaluation wrote, a CSR of the rows asked for). The coalitions are fitted on at most `max_match_rows` training
rows (their codes and labels in memory), the linear probes on at most `probe_max_n` of those; the held-out
MATCHScores and the probes' scores stream over every test row in blocks of `batch_size`; FMS and CKNNA, defined
on subsamples, use a seeded subsample ("pool") of at most `max_test_rows` test rows of the kind (FMS draws its
balanced rows per concept from it, at most `fms_max_n` each; CKNNA at most `cknna_max_n` of them, the O(n^2)
kernels). With the defaults and a test split of up to 20,000 rows per kind the pool is the whole split, as before
this bound existed.

Binarisation: a latent is active when its non-negative activation exceeds `evaluate.active_threshold` (the
published 1e-8 by default; 0 is an option); CEDAR and rotation models are seen through their half-axis view
(`SparseModel.latents`). Conventions that differ between the published evaluation code and our earlier choices
are settings with the published one as default: the binarisation threshold, TAPAScore's empty coalitions
(`tapas_empty`) and the FMS definition (`fms_removals`, `fms_levels`, `fms_exhausted`); the report states the ones in
use.

Devices: the linear probes and FMS run with torch on `evaluate.device` (`pipeline.metrics.probe`,
`pipeline.metrics.fms`; the three variants' FMS trees grow together, `fms_of_sets`); the other concept metrics on the
host (numpy, scipy.sparse).

Random codes: each latent fires independently with the trained model's activation frequency on
the matching rows, magnitude 1 (`pipeline.scoring.codes.RandomCodes`, one seeded stream per row set); before/after
images of a pair get independent draws, so their TAPAScore is 0 in expectation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from functools import cached_property
from typing import Protocol

import numpy as np
from scipy import sparse

from pipeline.data.dataset import sample_rows
from pipeline.metrics.cknna import KnnKernel, aligned, cknna_subsample, knn_kernel
from pipeline.metrics.csr import column_counts
from pipeline.metrics.fms import fms_of_sets
from pipeline.metrics.matching import Matching, binarise, coalition_members, counts_f1, fbmp, member_counts, nan_mean, one_to_one, strongest, tp_counts
from pipeline.metrics.probe import Probes, fit_probes, probe_scores
from pipeline.metrics.tapas import Tapas, delta_stay, tapascore
from pipeline.metrics.threads import thread_map
from pipeline.scoring.codes import RandomCodes
from pipeline.scoring.options import EvaluateSettings
from pipeline.scoring.timings import Timings
from pipeline.training.device import resolve_device

log = logging.getLogger(__name__)


def metrics_device(device: str) -> str:
    """Where the torch metrics (probes, FMS) run for `evaluate.device`: that device, but the CPU for Apple's "mps",
    which has no float64 (the metrics' counts and proxies are compared exactly in float64)."""
    resolved = resolve_device(device)
    return "cpu" if resolved.type == "mps" else str(resolved)


class CodeSource(Protocol):
    """Codes of a row set, read by row: a code set on disk (`CodeSet`), in memory (`ArrayCodes`) or random."""

    def codes(self, rows: np.ndarray) -> sparse.csr_array:
        """CSR (len(rows), L) of the non-negative latent activations of these rows (any order)."""
        ...


@dataclass
class ConceptData:
    """One kind's rows and labels for the concept metrics: row ids and readers, never whole splits in memory.

    match_rows: int64 (n1,) training rows the coalitions are fitted on (subsampled, ascending). test_rows: int64
    (n2,) every test row of the kind (held-out scores stream over them). pool_rows: int64 (n3,) the seeded
    subsample of test_rows for FMS and CKNNA. labels(rows) -> bool (len, A) the kind's label columns;
    embeddings(rows) -> float32 (len, d). families: one-hot attribute families (probe targets; {} = no probe).
    pair_ids: int64 (p,) the kind's intervention pairs; pairs_present bool (p, A) attributes of the base image,
    pairs_added / pairs_removed int64 (p,) kind-local columns (-1 = none); pairs_family str (p,) the family each pair
    edits (TAPAScore is also reported per family).
    """

    match_rows: np.ndarray
    test_rows: np.ndarray
    pool_rows: np.ndarray
    labels: Callable[[np.ndarray], np.ndarray]
    embeddings: Callable[[np.ndarray], np.ndarray]
    families: dict[str, list[int]]
    pair_ids: np.ndarray
    pairs_present: np.ndarray
    pairs_added: np.ndarray
    pairs_removed: np.ndarray
    pairs_family: np.ndarray

    @cached_property
    def y_match(self) -> np.ndarray:
        return self.labels(self.match_rows)

    @cached_property
    def y_pool(self) -> np.ndarray:
        return self.labels(self.pool_rows)


@dataclass(frozen=True)
class ProbeScores:
    """A model's linear-probe scores on a kind's test rows (`ProbeStream`): the mean over families of the probe's
    cross-entropy on the originals and on the reconstructions (nats), the KL(p_original || p_reconstruction) and
    both accuracies."""

    ce_original: float
    ce_reconstruction: float
    kl: float
    accuracy_original: float
    accuracy_reconstruction: float


@dataclass(frozen=True)
class VariantCodes:
    """One variant's codes (trained, untrained, random) on the kind's row sets; `probe`: its probe scores on the
    test rows (from the encode pass; None for random codes, which reconstruct nothing)."""

    match: CodeSource
    test: CodeSource
    before: CodeSource
    after: CodeSource
    probe: ProbeScores | None = None


@dataclass(frozen=True)
class MatchScores:
    """One matching rule's MATCHScore: coalitions fitted and scored on the matching rows (`match`, as published) and
    scored on the held-out test rows (`test`). `Undefined` when no attribute has a positive row."""

    match: float
    test: float


@dataclass(frozen=True)
class MatchingScores:
    """MATCHScores of every rule: `fbmp[beta][k]` (FBMP's coalitions cut to their first k latents) and one-to-one."""

    fbmp: Mapping[float, Mapping[int, MatchScores]]
    one_to_one: MatchScores

    def delta(self, other: "MatchingScores") -> "MatchingDeltas":
        """The in-sample MATCHScores of `self` less those of `other` (Delta-MATCHScore, rule by rule)."""
        return MatchingDeltas(
            fbmp={beta: {k: s.match - other.fbmp[beta][k].match for k, s in by_k.items()} for beta, by_k in self.fbmp.items()},
            one_to_one=self.one_to_one.match - other.one_to_one.match,
        )


@dataclass(frozen=True)
class MatchingDeltas:
    """Delta-MATCHScore (trained less untrained, in-sample) of every rule: `fbmp[beta][k]` and one-to-one."""

    fbmp: Mapping[float, Mapping[int, float]]
    one_to_one: float


@dataclass(frozen=True)
class TapasScores:
    """TAPAScore over the kind's pairs (`overall`) and over the pairs editing each family (`families`)."""

    overall: Tapas
    families: Mapping[str, Tapas]


@dataclass(frozen=True)
class VariantMetrics:
    """Every concept metric of one variant's codes on one kind. match_score: FBMP's MATCHScore at (tapas_beta,
    tapas_k); tapas / delta_stay: None when the kind has no pairs; probe: None for random codes or a kind without
    one-hot families; coalitions: the TAPAS coalition (latent indices) of each attribute; match_strongest: the
    MATCHScore rule on each row's `evaluate.match_strongest` largest activations (None when that is off, and for
    random codes, whose activations have no strength to rank)."""

    matching: MatchingScores
    match_score: float
    tapas: TapasScores | None
    delta_stay: float | None
    cknna: float
    fms: float
    probe: ProbeScores | None
    coalitions: tuple[tuple[int, ...], ...]
    match_strongest: float | None = None


@dataclass(frozen=True)
class KindMetrics:
    """The concept metrics of one kind: each variant's, and Delta-MATCHScore (trained less untrained) at the TAPAS
    rule (`delta_match_score`), for every rule (`delta_matching`) and on the strongest activations
    (`delta_match_strongest`)."""

    trained: VariantMetrics
    untrained: VariantMetrics
    random: VariantMetrics
    delta_match_score: float
    delta_matching: MatchingDeltas
    delta_match_strongest: float | None = None


def random_variant(frequency: np.ndarray, seed: int) -> VariantCodes:
    """Random codes whose latents fire independently with `frequency` (L,), magnitude 1, ignoring the input; one
    seeded stream per row set."""
    match, test, before, after = (RandomCodes(np.asarray(frequency, dtype=np.float64), seed, stream) for stream in range(4))
    return VariantCodes(match, test, before, after)


def blocks(rows: np.ndarray, size: int) -> list[np.ndarray]:
    """`rows` in consecutive blocks of at most `size`."""
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def matching_scores(codes: VariantCodes, data: ConceptData, settings: EvaluateSettings) -> tuple[MatchingScores, Matching]:
    """MATCHScores (in-sample and held-out) for every rule; returns them and the TAPAS matching. The held-out
    scores stream over the test rows in blocks, summing each rule's coalition counts (`member_counts`)."""
    active = binarise(codes.match.codes(data.match_rows), settings.active_threshold)
    tp = tp_counts(active, data.y_match)  # every rule's first step: computed once
    in_sample: dict[tuple[float, int], float] = {}
    coalitions: dict[tuple[float, int], list[np.ndarray]] = {}  # (beta, k); one-to-one is (0, 0)
    tapas_matching = None
    largest = max(settings.match_ks)

    # the betas side by side on the process's threads (scipy's sparse products and numpy's reductions free the GIL);
    # each k's coalitions are the first k latents of the largest k's, their in-sample scores FBMP's running counts
    fitted = thread_map(lambda beta: fbmp(active, data.y_match, beta=beta, k=largest, tp=tp), settings.betas)
    for beta, m in zip(settings.betas, fitted):
        for k in settings.match_ks:
            prefix = m.truncated(k)
            in_sample[(beta, k)], coalitions[(beta, k)] = prefix.score, prefix.coalitions
        if beta == settings.tapas_beta and settings.tapas_k <= largest:
            tapas_matching = m.truncated(settings.tapas_k)
    o = one_to_one(active, data.y_match, tp=tp)
    coalitions[(0.0, 0)] = o.coalitions
    members = coalition_members(list(coalitions.values()), active.shape[1], data.y_match.shape[1])  # every rule: one product per block
    summed = np.zeros((len(coalitions), 3, data.y_match.shape[1]), np.int64)
    for block in blocks(data.test_rows, settings.batch_size):
        summed += member_counts(binarise(codes.test.codes(block), settings.active_threshold), data.labels(block), members)
    counts = dict(zip(coalitions, summed))
    # every rule sees the same test labels: one warning about undefined attributes (one-to-one's)
    fbmp_scores = {beta: {k: MatchScores(in_sample[(beta, k)], nan_mean(counts_f1(counts[(beta, k)], warn=False))) for k in settings.match_ks}
                   for beta in settings.betas}
    scores = MatchingScores(fbmp_scores, MatchScores(o.score, nan_mean(counts_f1(counts[(0.0, 0)]))))
    if tapas_matching is None:
        tapas_matching = fbmp(active, data.y_match, beta=settings.tapas_beta, k=settings.tapas_k, tp=tp)
    return scores, tapas_matching


def fit_family_probes(data: ConceptData, seed: int, max_n: int, device: str = "cpu") -> Probes | None:
    """The multinomial probes of every one-hot attribute family (one model, a head per family: `fit_probes`), fitted
    on the dense embeddings of at most `max_n` of the matching rows (a seeded subsample: the probe's cost grows with
    its rows, its quality hardly beyond ~10^4) on `device`; None when the kind has no family."""
    if not data.families:
        return None
    keep = sample_rows(np.arange(len(data.match_rows)), max_n, seed)
    x, labels = data.embeddings(data.match_rows[keep]), data.y_match[keep]
    for family, columns in data.families.items():
        if not (labels[:, columns].sum(axis=1) == 1).all():
            raise ValueError(f"attribute family {family!r} is not one-hot; the linear probe needs one class per image")
    return fit_probes(x, _family_classes(labels, data.families), device=device)


def _family_classes(labels: np.ndarray, families: dict[str, list[int]]) -> np.ndarray:
    """int64 (n, F): each row's class in every family (the index of its attribute within the family's columns)."""
    return np.stack([np.argmax(labels[:, columns], axis=1) for columns in families.values()], axis=1)


class ProbeStream:
    """Probe scores of reconstructions streamed over a kind's test rows: `add` each encoded batch (rows of any
    kind; those of this kind are kept), `result` gives the mean over families of the probe CE on originals and on
    reconstructions, the KL and both accuracies (each family's mean over the kind's test rows). A test row whose class
    the probe never saw among the matching rows (rare classes of small datasets) is left out of that family's scores:
    a probe has no output for it. timings: the scoring's seconds go to its "probes" part."""

    FIELDS = tuple(f.name for f in fields(ProbeScores))

    def __init__(self, probes: Probes | None, data: ConceptData, timings: Timings | None = None) -> None:
        self.probes, self.data = probes, data
        self.timings = timings or Timings()
        n_families = probes.n_families if probes is not None else 0
        self.sums = np.zeros((n_families, len(self.FIELDS)))
        self.counts = np.zeros(n_families, dtype=np.int64)

    def add(self, rows: np.ndarray, x: np.ndarray, x_hat: np.ndarray) -> None:
        mine = np.isin(rows, self.data.test_rows, assume_unique=True)
        if self.probes is None or not mine.any():
            return
        with self.timings.part("probes"):
            labels = _family_classes(self.data.labels(rows[mine]), self.data.families)
            for f, result in enumerate(probe_scores(self.probes, x[mine], x_hat[mine].astype(np.float32), labels)):
                if result.n:
                    self.sums[f] += result.n * np.array([getattr(result, field) for field in self.FIELDS])
                    self.counts[f] += result.n

    def result(self) -> ProbeScores | None:
        """The scores over every row added (None when no row of the kind was scored)."""
        scored = self.counts > 0
        if not scored.any():
            return None
        means = (self.sums[scored] / self.counts[scored, None]).mean(axis=0)
        return ProbeScores(*(float(v) for v in means))


def tapas_scores(before: sparse.csr_array, after: sparse.csr_array, data: ConceptData, coalitions: list[np.ndarray], empty: str) -> TapasScores:
    """TAPAScore of the kind's pairs (binarised codes before/after (p, L)), over all of them and per edited family."""
    per_family = {}
    for family in np.unique(data.pairs_family):
        edits = np.flatnonzero(data.pairs_family == family)
        per_family[str(family)] = tapascore(before[edits], after[edits], data.pairs_added[edits], data.pairs_removed[edits], coalitions, empty)
    return TapasScores(tapascore(before, after, data.pairs_added, data.pairs_removed, coalitions, empty), per_family)


@dataclass(frozen=True)
class CknnaSide:
    """The embeddings' side of CKNNA for one kind, shared by every variant's codes: near, int64 (m,) positions in
    `ConceptData.pool_rows` (the seeded subsample of at most `cknna_max_n`); embedded, their kernel and kNN mask."""

    near: np.ndarray
    embedded: KnnKernel


def cknna_side(data: ConceptData, settings: EvaluateSettings, seed: int) -> CknnaSide:
    near = cknna_subsample(len(data.pool_rows), settings.cknna_max_n, seed)
    return CknnaSide(near, knn_kernel(data.embeddings(data.pool_rows[near]), settings.cknna_k, "embeddings"))


def variant_metrics(codes: VariantCodes, pool: sparse.csr_array, fms_score: float, data: ConceptData, settings: EvaluateSettings,
                    side: CknnaSide, timings: Timings | None = None) -> VariantMetrics:
    """Every concept metric of one variant's codes; `pool`: its codes of the pool rows, `fms_score`: their FMS (the
    variants' FMS grow together, `concept_metrics`); `side`: the embeddings' CKNNA side (`cknna_side`, the same for
    every variant of the kind, computed once)."""
    timings = timings or Timings()
    with timings.part("matching"):
        scores, matching = matching_scores(codes, data, settings)
    tapas = stay = None
    if len(data.pair_ids) > 0:
        with timings.part("tapas"):
            before = binarise(codes.before.codes(data.pair_ids), settings.active_threshold)
            after = binarise(codes.after.codes(data.pair_ids), settings.active_threshold)
            tapas = tapas_scores(before, after, data, matching.coalitions, settings.tapas_empty)
            stay = delta_stay(before, after, data.pairs_present, data.pairs_added, data.pairs_removed, matching.coalitions, settings.tapas_empty)
    with timings.part("cknna"):
        similarity = aligned(knn_kernel(pool[side.near], settings.cknna_k, "codes"), side.embedded)
    return VariantMetrics(
        matching=scores, match_score=scores.fbmp[settings.tapas_beta][settings.tapas_k].match, tapas=tapas, delta_stay=stay,
        cknna=similarity, fms=fms_score, probe=codes.probe, coalitions=tuple(tuple(c.tolist()) for c in matching.coalitions),
    )


def strongest_match_score(codes: VariantCodes, data: ConceptData, settings: EvaluateSettings) -> float:
    """MATCHScore's rule (tapas_beta, tapas_k) on each matching row's `settings.match_strongest` largest activations."""
    top = strongest(codes.match.codes(data.match_rows), settings.match_strongest)
    return fbmp(binarise(top, settings.active_threshold), data.y_match, beta=settings.tapas_beta, k=settings.tapas_k).score


def concept_metrics(trained: VariantCodes, untrained: VariantCodes, data: ConceptData, settings: EvaluateSettings, seed: int,
                    timings: Timings | None = None) -> KindMetrics:
    """Every concept metric for the trained model's codes, its untrained twin's and random codes, plus the deltas;
    their seconds go to `timings`."""
    timings = timings or Timings()
    frequency = column_counts(binarise(trained.match.codes(data.match_rows), settings.active_threshold)) / len(data.match_rows)
    with timings.part("cknna"):
        side = cknna_side(data, settings, seed)
    variants = (trained, untrained, random_variant(frequency, seed))
    pools = [codes.test.codes(data.pool_rows) for codes in variants]
    with timings.part("fms"):  # the three variants' trees in shared blocks (`fms_of_sets`)
        scores = fms_of_sets(pools, data.y_pool, max_n=settings.fms_max_n, seed=seed, removals=settings.fms_removals,
                             levels=settings.fms_levels, exhausted=settings.fms_exhausted, device=metrics_device(settings.device))
    of_trained, of_untrained, of_random = (variant_metrics(codes, pool, result.fms, data, settings, side, timings)
                                           for codes, pool, result in zip(variants, pools, scores))
    delta = of_trained.matching.delta(of_untrained.matching)
    strong = None
    if settings.match_strongest is not None:  # the trained model and its twin only: random codes have no strength to rank
        with timings.part("matching"):
            trained_strong, untrained_strong = thread_map(lambda codes: strongest_match_score(codes, data, settings), (trained, untrained))
            of_trained = replace(of_trained, match_strongest=trained_strong)
            of_untrained = replace(of_untrained, match_strongest=untrained_strong)
        strong = of_trained.match_strongest - of_untrained.match_strongest
    return KindMetrics(of_trained, of_untrained, of_random, delta.fbmp[settings.tapas_beta][settings.tapas_k], delta, strong)
