"""The evaluation's options (params.yaml `evaluate:`) and the planted-structure benchmark's (`planted:`). Light (no
torch, no scikit-learn), so that params.yaml's schema loads without the metrics."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, Strict, model_validator

from pipeline.metrics.conventions import PUBLISHED_REMOVALS, PUBLISHED_THRESHOLD
from pipeline.models.options import OPTIONS
from pipeline.settings import Device, NonNegativeFloat, PositiveFloat, PositiveInt, settings


@settings
class EvaluateSettings:
    """How every grid cell is evaluated (params.yaml `evaluate:`).

    ks: K values of the FVU-vs-K curve (rotations re-sparsify at each; SAEs use their own k). batch_size: rows
    per encoding batch and per streamed block of held-out scoring. device: where the models encode ("auto": cuda
    when present); evaluation stays in float32. betas / match_ks: the FBMP rules reported (F_beta of the residual; coalition sizes); the
    recommended protocol is beta 0.5, k 3, which TAPAScore uses (tapas_beta, tapas_k). max_match_rows:
    training-split rows used to fit coalitions (subsampled with the seed). cknna_k: neighbours per row of CKNNA;
    cknna_max_n / fms_max_n: subsample sizes of the O(n^2) CKNNA and of the FMS trees. probe_max_n: matching
    rows the linear probes are fitted on (a seeded subsample when there are more). max_test_rows: the
    seeded subsample of a kind's test rows (the pool) that FMS and CKNNA draw from (the module docstring lists what
    memory grows with).
    Conventions (published default first, `pipeline.metrics` documents each): active_threshold: a latent is active
    above it (1e-8; 0 = any positive activation). tapas_empty: a pair whose added coalition is empty leaves both
    means and Delta-stay ("drop_pair"), or an empty coalition counts as 0 ("zero") or leaves only its own mean
    ("skip"). fms_removals: FMS@p averaged over these p (1..9; one value = FMS@p). fms_levels: FMS's global term with
    the no-split level ("published") or over levels 2..D ("paper"). fms_exhausted: a removal count after which no
    latent can split leaves the mean ("drop") or scores the majority rate ("majority").
    match_strongest: a diagnostic beside MATCHScore (None: off): the same rule (tapas_beta, tapas_k) on each row's
    `match_strongest` largest activations only (`pipeline.metrics.matching.strongest`), and its Delta against the
    untrained twin; for a run with more active latents per row it tells a model whose strong activations match
    the concepts, but whose weak ones (binarised like strong ones) cost precision, from a model that matches them
    at no strength (docs/science.md, "Delta-MATCHScore at large k").
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
    probe_max_n: Annotated[int, Strict(), Field(ge=10)] = 20_000
    max_test_rows: Annotated[int, Strict(), Field(ge=10)] = 20_000
    device: Device = "auto"
    active_threshold: NonNegativeFloat = PUBLISHED_THRESHOLD
    tapas_empty: Literal["drop_pair", "zero", "skip"] = "drop_pair"
    fms_removals: tuple[PositiveInt, ...] = PUBLISHED_REMOVALS
    fms_levels: Literal["published", "paper"] = "published"
    fms_exhausted: Literal["drop", "majority"] = "drop"
    match_strongest: PositiveInt | None = 8

    @model_validator(mode="after")
    def _tapas_rule_is_reported(self) -> "EvaluateSettings":
        if not self.ks or not self.betas or not self.match_ks or not self.fms_removals:
            raise ValueError("ks, betas, match_ks and fms_removals must each list at least one value")
        if self.tapas_k not in self.match_ks:
            raise ValueError(f"tapas_k={self.tapas_k} must be one of match_ks {list(self.match_ks)}")
        if self.tapas_beta not in self.betas:
            raise ValueError(f"tapas_beta={self.tapas_beta} must be one of betas {list(self.betas)}")
        return self


@settings
class PlantedSettings:
    """The benchmark's grid (params.yaml `planted:`): dimension d, rows n, every k of `ks` and noise of `noises`,
    each method of `methods` (rotations, and SAEs with a dictionary of `dict_ratio` x d latents: 2 gives one latent
    per signed planted direction, the tightest dictionary that can hold the planted code), trained for `epochs`
    (the rest of the loop settings is the method's: params' `train:` with its `methods.<m>.train` override)."""

    d: PositiveInt = 32
    n: PositiveInt = 4000
    ks: tuple[PositiveInt, ...] = (4,)
    noises: tuple[NonNegativeFloat, ...] = (0.01, 0.1)
    epochs: PositiveInt = 20
    dict_ratio: PositiveInt = 2
    methods: tuple[str, ...] = Field(default=("cedar", "identity", "pca", "ica", "random_rotation"), min_length=1)

    @model_validator(mode="after")
    def _valid(self) -> "PlantedSettings":
        bad = [m for m in self.methods if m not in OPTIONS]
        if bad:
            raise ValueError(f"methods: {bad} are not methods ({', '.join(sorted(OPTIONS))})")
        if any(k > self.d for k in self.ks):
            raise ValueError(f"ks: every k must be in 1..d={self.d}, got {list(self.ks)}")
        if self.n < 100:
            raise ValueError(f"n: at least 100 rows, got {self.n}")
        return self
