"""Concept-level evaluation of one sparse model against its sanity-check baselines (no I/O).

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

Binarisation: a latent is active when its non-negative activation exceeds `evaluate.active_threshold` (the
published 1e-8 by default; 0 is an option); CEDAR and rotation models are seen through their half-axis view
(`SparseModel.latents`). Conventions that differ between the published evaluation code and our earlier choices
are settings with the published one as default: the binarisation threshold, TAPAScore's empty coalitions
(`tapas_empty`) and the FMS definition (`fms_removals`, `fms_levels`); the report states the ones in use.

Random codes: each latent fires independently with the trained model's activation frequency on
the matching rows, magnitude 1, seeded; before/after images of a pair get independent draws, so
their TAPAScore is 0 in expectation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import numpy as np
import torch
from pydantic import Field, Strict, model_validator

from pipeline.metrics.cknna import cknna
from pipeline.metrics.fms import PUBLISHED_REMOVALS, fms
from pipeline.metrics.matching import PUBLISHED_THRESHOLD, Matching, binarise, coalition_f1, fbmp, nan_mean, one_to_one
from pipeline.metrics.probe import fit_probe, probe_scores
from pipeline.metrics.tapas import delta_stay, tapascore
from pipeline.models.base import SparseModel
from pipeline.settings import NonNegativeFloat, PositiveFloat, PositiveInt, settings

log = logging.getLogger(__name__)


@settings
class EvaluateSettings:
    """How every grid cell is evaluated (params.yaml `evaluate:`).

    ks: K values of the FVU-vs-K curve (rotations re-sparsify at each; SAEs use their own k). batch_size: rows
    per encoding batch. betas / match_ks: the FBMP rules reported (F_beta of the residual; coalition sizes); the
    recommended protocol is beta 0.5, k 3, which TAPAScore uses (tapas_beta, tapas_k). max_match_rows:
    training-split rows used to fit coalitions (subsampled with the seed). cknna_k: neighbours per row of CKNNA;
    cknna_max_n / fms_max_n: subsample sizes of the O(n^2) CKNNA and of the FMS trees.
    Conventions (published default first, `pipeline.metrics` documents each): active_threshold: a latent is active
    above it (1e-8; 0 = any positive activation). tapas_empty: a pair whose coalition is empty counts as 0
    ("zero") or is left out ("skip"). fms_removals: FMS@p averaged over these p (1..9; one value = FMS@p).
    fms_levels: FMS's global term with the no-split level ("published") or over levels 2..D ("paper").
    """

    ks: tuple[PositiveInt, ...] = (1, 2, 4, 8, 16, 32)
    batch_size: PositiveInt = 1024
    betas: tuple[PositiveFloat, ...] = (0.25, 0.5, 1.0)
    match_ks: tuple[PositiveInt, ...] = (1, 2, 3, 4, 5)
    tapas_beta: PositiveFloat = 0.5
    tapas_k: PositiveInt = 3
    max_match_rows: Annotated[int, Strict(), Field(ge=10)] = 20_000
    cknna_k: PositiveInt = 10
    cknna_max_n: Annotated[int, Strict(), Field(ge=10)] = 2000
    fms_max_n: Annotated[int, Strict(), Field(ge=10)] = 2000
    active_threshold: NonNegativeFloat = PUBLISHED_THRESHOLD
    tapas_empty: Literal["zero", "skip"] = "zero"
    fms_removals: tuple[PositiveInt, ...] = PUBLISHED_REMOVALS
    fms_levels: Literal["published", "paper"] = "published"

    @model_validator(mode="after")
    def _tapas_rule_is_reported(self) -> "EvaluateSettings":
        if not self.ks or not self.betas or not self.match_ks or not self.fms_removals:
            raise ValueError("ks, betas, match_ks and fms_removals must each list at least one value")
        if self.tapas_k not in self.match_ks:
            raise ValueError(f"tapas_k={self.tapas_k} must be one of match_ks {list(self.match_ks)}")
        if self.tapas_beta not in self.betas:
            raise ValueError(f"tapas_beta={self.tapas_beta} must be one of betas {list(self.betas)}")
        return self


@dataclass
class ConceptData:
    """Embeddings and labels the concept metrics need (all numpy, rows aligned)."""

    x_match: np.ndarray  # float32 (n1, d): matching rows (training split)
    y_match: np.ndarray  # bool (n1, A)
    x_test: np.ndarray  # float32 (n2, d)
    y_test: np.ndarray  # bool (n2, A)
    families: dict[str, list[int]]  # one-hot attribute families (linear-probe targets); {} = no probe
    pairs_before: np.ndarray  # float32 (p, d)
    pairs_after: np.ndarray  # float32 (p, d)
    pairs_present: np.ndarray  # bool (p, A) attributes of the base image
    pairs_added: np.ndarray  # int64 (p,), -1 = none
    pairs_removed: np.ndarray  # int64 (p,)


@dataclass
class Codes:
    """Non-negative latent activations of one variant on every row set."""

    match: np.ndarray
    test: np.ndarray
    before: np.ndarray
    after: np.ndarray
    reconstruction_test: np.ndarray | None = None  # (n2, d) or None for random codes
    extra: dict[str, Any] = field(default_factory=dict)


@torch.no_grad()
def model_codes(model: SparseModel, data: ConceptData, batch_size: int = 4096) -> Codes:
    """Latent activations (half-axis view for signed models) and test reconstructions of `model`."""
    model.eval()

    def latents(x: np.ndarray) -> np.ndarray:
        out = []
        for start in range(0, len(x), batch_size):
            xb = torch.as_tensor(x[start : start + batch_size], dtype=torch.float32)
            out.append(model.latents(model.encode(xb)).numpy())
        return np.concatenate(out) if out else np.zeros((0, model.n_half_latents), np.float32)

    x_test = torch.as_tensor(data.x_test, dtype=torch.float32)
    return Codes(
        match=latents(data.x_match), test=latents(data.x_test), before=latents(data.pairs_before), after=latents(data.pairs_after),
        reconstruction_test=model(x_test).numpy(),
    )


def random_codes(frequency: np.ndarray, data: ConceptData, seed: int) -> Codes:
    """Codes whose latents fire independently with `frequency` (L,), magnitude 1, ignoring the input."""
    rng = np.random.default_rng(seed)

    def draw(n: int) -> np.ndarray:
        return (rng.random((n, len(frequency))) < frequency).astype(np.float32)

    return Codes(match=draw(len(data.x_match)), test=draw(len(data.x_test)),
                 before=draw(len(data.pairs_before)), after=draw(len(data.pairs_after)))


def prefix_scores(active: np.ndarray, labels: np.ndarray, matching: Matching, ks: tuple[int, ...]) -> dict[int, float]:
    """MATCHScore of the first-k prefix of every coalition, for each k."""
    return {k: nan_mean(coalition_f1(active, labels, [c[:k] for c in matching.coalitions])) for k in ks}


def matching_scores(codes: Codes, data: ConceptData, settings: EvaluateSettings) -> tuple[dict[str, Any], Matching]:
    """MATCHScores (in-sample and held-out) for every rule; returns them and the TAPAS matching."""
    active, active_test = binarise(codes.match, settings.active_threshold), binarise(codes.test, settings.active_threshold)
    scores: dict[str, Any] = {}
    tapas_matching = None
    for beta in settings.betas:
        m = fbmp(active, data.y_match, beta=beta, k=max(settings.match_ks))
        scores[f"fbmp_b{beta:g}"] = {
            "match": prefix_scores(active, data.y_match, m, settings.match_ks),
            "test": prefix_scores(active_test, data.y_test, m, settings.match_ks),
        }
        if beta == settings.tapas_beta:
            tapas_matching = Matching([c[: settings.tapas_k] for c in m.coalitions], m.f1, m.score)
    o = one_to_one(active, data.y_match)
    scores["one_to_one"] = {"match": o.score, "test": nan_mean(coalition_f1(active_test, data.y_test, o.coalitions))}
    if tapas_matching is None:
        tapas_matching = fbmp(active, data.y_match, beta=settings.tapas_beta, k=settings.tapas_k)
    return scores, tapas_matching


def probe_metrics(codes: Codes, data: ConceptData, probes: dict[str, Any]) -> dict[str, float] | None:
    """Mean over attribute families of the probe CE on originals vs reconstructions, and the KL."""
    if codes.reconstruction_test is None or not data.families:
        return None
    results = []
    for family, columns in data.families.items():
        y_test = np.argmax(data.y_test[:, columns], axis=1)
        results.append(probe_scores(probes[family], data.x_test, codes.reconstruction_test.astype(np.float32), y_test))
    return {
        "ce_original": float(np.mean([r.ce_original for r in results])),
        "ce_reconstruction": float(np.mean([r.ce_reconstruction for r in results])),
        "kl": float(np.mean([r.kl for r in results])),
        "accuracy_original": float(np.mean([r.accuracy_original for r in results])),
        "accuracy_reconstruction": float(np.mean([r.accuracy_reconstruction for r in results])),
    }


def fit_family_probes(data: ConceptData, seed: int) -> dict[str, Any]:
    """One multinomial probe per one-hot attribute family, fitted on dense matching-split embeddings."""
    probes = {}
    for family, columns in data.families.items():
        y = data.y_match[:, columns]
        if not (y.sum(axis=1) == 1).all():
            raise ValueError(f"attribute family {family!r} is not one-hot; the linear probe needs one class per image")
        probes[family] = fit_probe(data.x_match, np.argmax(y, axis=1), seed=seed)
    return probes


def variant_metrics(codes: Codes, data: ConceptData, settings: EvaluateSettings, probes: dict[str, Any], seed: int) -> dict[str, Any]:
    scores, matching = matching_scores(codes, data, settings)
    before, after = binarise(codes.before, settings.active_threshold), binarise(codes.after, settings.active_threshold)
    has_pairs = len(before) > 0
    tapas = tapascore(before, after, data.pairs_added, data.pairs_removed, matching.coalitions, settings.tapas_empty) if has_pairs else None
    stay = delta_stay(before, after, data.pairs_present, data.pairs_added, data.pairs_removed, matching.coalitions) if has_pairs else None
    fms_result = fms(codes.test, data.y_test, max_n=settings.fms_max_n, seed=seed, removals=settings.fms_removals, levels=settings.fms_levels)
    return {
        "matching": scores,
        "match_score": scores[f"fbmp_b{settings.tapas_beta:g}"]["match"][settings.tapas_k],
        "tapas": None if tapas is None else {"score": tapas.score, "delta_add": tapas.delta_add, "delta_rem": tapas.delta_rem,
                                             "n_pairs": tapas.n_pairs, "n_add": tapas.n_add, "n_rem": tapas.n_rem},
        "delta_stay": stay,
        "cknna": cknna(codes.test, data.x_test, k=settings.cknna_k, max_n=settings.cknna_max_n, seed=seed),
        "fms": fms_result.fms,
        "probe": probe_metrics(codes, data, probes),
        "coalitions": [c.tolist() for c in matching.coalitions],
    }


def concept_metrics(model: SparseModel, twin: SparseModel, data: ConceptData, settings: EvaluateSettings, seed: int) -> dict[str, Any]:
    """Every concept metric for the trained model, its untrained twin and random codes, plus the deltas."""
    probes = fit_family_probes(data, seed)
    trained_codes = model_codes(model, data)
    frequency = binarise(trained_codes.match, settings.active_threshold).mean(axis=0)
    variants = {
        "trained": variant_metrics(trained_codes, data, settings, probes, seed),
        "untrained": variant_metrics(model_codes(twin, data), data, settings, probes, seed),
        "random": variant_metrics(random_codes(frequency, data, seed), data, settings, probes, seed),
    }
    trained, untrained = variants["trained"]["matching"], variants["untrained"]["matching"]
    delta = {}
    for rule, values in trained.items():
        if isinstance(values["match"], dict):
            delta[rule] = {k: values["match"][k] - untrained[rule]["match"][k] for k in values["match"]}
        else:
            delta[rule] = values["match"] - untrained[rule]["match"]
    variants["delta_match_score"] = delta[f"fbmp_b{settings.tapas_beta:g}"][settings.tapas_k]
    variants["delta_matching"] = delta
    return variants
