"""The options of every sparse model, and which methods exist: light (no torch), so that params.yaml's schema
(`pipeline.config`) and `cedar validate` can check a `methods.<m>` entry without loading a model.

Each model class sets `Options` to its class here (`TopKSAE.Options is TopKOptions`); a subclass's options extend
its parent's. The model class's docstring documents its options (what each does, the published setting, why our
default); the fields, their types, defaults and constraints are these dataclasses. `pipeline.models.registry`
maps the same method names to the model classes (a test checks the two agree).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, Strict

from pipeline.settings import Bool, Fraction, NonNegativeFloat, NonNegativeInt, OpenFraction, PositiveFloat, PositiveInt, settings

#: how an SAE's decoder bias starts (`SAE.fit_init`)
BiasInit = Literal["mean", "geometric_median"]
#: CEDAR's orthogonal map A -> U, the shape of its dense-to-sparse curriculum, and its random-k mode (`Cedar`)
Parametrization = Literal["expm", "cayley", "householder"]
CurriculumShape = Literal["linear", "cosine", "exponential"]
RandomK = Literal["none", "uniform", "loguniform"]
#: a prefix of a Matryoshka dictionary, as a fraction of its size
PrefixFraction = Annotated[float, Strict(), Field(gt=0, le=1)]


@settings
class NoOptions:
    """No options."""


@settings
class SAEOptions:
    """Options of `SAE` (`pipeline.models.sae`); its docstring documents them."""

    bias_init: BiasInit = "mean"
    dead_steps: PositiveInt = 50
    resample_every: Fraction = 0.05
    resample_until: Fraction = 0.5
    resample_margin: PositiveFloat = 1.0
    resample_refine: NonNegativeInt = 20
    resample_untangle: Fraction = 1.0  # off; on where measured to help (BatchTopK, JumpReLU: see `SAE`)


@settings
class TopKOptions(SAEOptions):
    """Options of `TopKSAE` (`pipeline.models.topk`); its docstring documents them."""

    k_aux: PositiveInt = 512
    aux_coef: NonNegativeFloat = 1 / 32


@settings
class BatchTopKOptions(TopKOptions):
    """Options of `BatchTopKSAE` (`pipeline.models.topk`); its docstring documents them."""

    threshold_decay: OpenFraction = 0.9
    resample_untangle: Fraction = 0.2


@settings
class MatryoshkaOptions(TopKOptions):
    """Options of `MatryoshkaSAE` (`pipeline.models.topk`); its docstring documents them."""

    k_levels: tuple[PositiveInt, ...] = ()
    level_weights: tuple[NonNegativeFloat, ...] = ()


@settings
class PrefixMatryoshkaOptions(BatchTopKOptions):
    """Options of `PrefixMatryoshkaSAE` (`pipeline.models.topk`); its docstring documents them."""

    prefix_fractions: tuple[PrefixFraction, ...] = (0.125, 0.25, 0.5, 1.0)
    prefix_weights: tuple[NonNegativeFloat, ...] = ()


@settings
class ReLUOptions(SAEOptions):
    """Options of `ReLUSAE` (`pipeline.models.penalty`); its docstring documents them."""

    l1_coef: NonNegativeFloat = 0.05
    target_l0: Bool = True
    l0_control_rate: PositiveFloat = 0.05
    l0_slack: NonNegativeFloat = 0.05
    rescale: Bool = False


@settings
class JumpReLUOptions(SAEOptions):
    """Options of `JumpReLUSAE` (`pipeline.models.penalty`); its docstring documents them."""

    l0_coef: NonNegativeFloat = 1e-3
    target_l0: Bool = True
    l0_control_rate: PositiveFloat = 0.02
    bandwidth: PositiveFloat = 1e-3
    resample_untangle: Fraction = 0.2
    refit_thresholds: Bool = True


@settings
class ICAOptions:
    """fun: FastICA's contrast function; logcosh is the robust general choice, "exp" suits very
    super-Gaussian (sparse) sources, "cube" is kurtosis. max_iter: FastICA iterations; non-convergence is
    logged, not fatal (the polar factor keeps the basis orthogonal anyway). tol: FastICA's convergence
    tolerance (scikit-learn's default)."""

    fun: Literal["logcosh", "exp", "cube"] = "logcosh"
    max_iter: PositiveInt = 400
    tol: PositiveFloat = 1e-4


@settings
class CedarOptions:
    """Options of `Cedar` (`pipeline.models.cedar`); its docstring documents them."""

    parametrization: Parametrization = "expm"
    init: Literal["identity", "random", "pca"] = "pca"
    loss: Literal["l1", "l2"] = "l1"
    init_scale: NonNegativeFloat = 0.8
    k_start: NonNegativeInt = 0
    curriculum_frac: Fraction = 0.5
    curriculum_shape: CurriculumShape = "exponential"
    random_k: RandomK = "uniform"
    random_k_min: PositiveFloat = 0.5


#: method name -> its options class (the names of `pipeline.models.registry.METHODS`)
OPTIONS: dict[str, type] = {
    # rotations of the embedding space (n_latents = d, signed codes)
    "cedar": CedarOptions,
    "identity": NoOptions,
    "pca": NoOptions,
    "ica": ICAOptions,
    "random_rotation": NoOptions,
    # sparse autoencoders (n_latents = dictionary size, non-negative codes)
    "relu": ReLUOptions,
    "topk": TopKOptions,
    "batchtopk": BatchTopKOptions,
    "jumprelu": JumpReLUOptions,
    "matryoshka": MatryoshkaOptions,
    "matryoshka_prefix": PrefixMatryoshkaOptions,
}

_RESAMPLE = "SAE: idle latents moved onto sparse directions of the residual in the first half of training"

#: options that change a published method, per method: option -> what it does, in the words the report's
#: conventions line uses (shown "on" when the option's value is truthy, "off" otherwise). An option departs from the
#: published recipe when its value differs from the published value: `PUBLISHED` where the default itself departs
#: (and the docstring of the model class says why), else the default.
DEVIATIONS: dict[str, dict[str, str]] = {
    "relu": {"rescale": "ReLU SAE: L1 shrinkage corrected after training (per-latent gains)",
             "l0_slack": "ReLU SAE: L0 controller aimed a little above k (the smallest penalty that holds L0 near k)",
             "resample_every": _RESAMPLE},
    "jumprelu": {"resample_every": _RESAMPLE,
                 "refit_thresholds": "JumpReLU SAE: thresholds refitted exactly after training, at the L0 target"},
    **{method: {"resample_every": _RESAMPLE} for method in ("topk", "batchtopk", "matryoshka", "matryoshka_prefix")},
}

#: the published values of the options whose default departs from the published recipe (listed in `DEVIATIONS`): no
#: SAE paper's final recipe resamples latents, a fixed-coefficient ReLU SAE has no L0 target to aim above, and the
#: JumpReLU SAE ends with its trained thresholds. The defaults depart because without them the SAEs stop short of the
#: planted oracle (`pipeline.models.sae.SAE`, `pipeline.models.penalty.ReLUSAE`, `pipeline.models.penalty.JumpReLUSAE`,
#: docs/science.md section 2).
PUBLISHED: dict[str, dict[str, object]] = {
    "relu": {"resample_every": 0.0, "l0_slack": 0.0},
    "jumprelu": {"resample_every": 0.0, "refit_thresholds": False},
    **{method: {"resample_every": 0.0} for method in ("topk", "batchtopk", "matryoshka", "matryoshka_prefix")},
}

#: methods whose latent count is the embedding dimension (a rotation of the space)
ROTATION_METHODS: frozenset[str] = frozenset({"cedar", "identity", "pca", "ica", "random_rotation"})


def options_class(method: str) -> type:
    """The options class of `method`; a clear error for an unknown name."""
    if method not in OPTIONS:
        raise KeyError(f"unknown method {method!r}; known methods: {', '.join(sorted(OPTIONS))}")
    return OPTIONS[method]
