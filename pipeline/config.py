"""One typed schema for all of params.yaml; every stage validates through `load_params`.

Unknown keys, wrong types and impossible values fail with one line per problem naming the key
(e.g. `params.yaml: sweep.sae.ks: k=512 > dictionary size 256`), before any work starts.

Sweep design: the grid is two DVC `matrix` stages — rotations (CEDAR and the rotation
baselines, one latent per embedding dimension, so only k varies) and SAEs (method x dictionary
size x k). A k larger than a dictionary size (or than d for rotations) is rejected here, not
skipped: DVC expands the full cross product, so an impossible cell would otherwise fail late.
Each method's options are validated against the keyword-only parameters of its model class
constructor, so the class signature is the single documented list of options.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from pipeline.train import TrainSettings

if TYPE_CHECKING:  # imported lazily below: the explain library loads torch models the schema does not need
    from pipeline.explain.captions import DecoderConfig
    from pipeline.explanations import ExplainSettings


class ParamsError(ValueError):
    """params.yaml is malformed; the message has one line per problem, each naming the key."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SceneKind(Strict):
    """How many scenes of one kind to render, and how many intervention pairs (from its test split)."""

    n_images: int = Field(ge=20)
    n_pairs: int = Field(0, ge=0)
    max_objects: int = Field(5, ge=1, le=9)  # multi-object scenes only


class ScenesData(Strict):
    """The procedural offline world (pipeline.data.scenes): `objects` (CUB-like, one-hot attribute
    families, attribute-edit pairs) and/or `multi` (COCO-like, multi-label categories, object-removal
    pairs)."""

    source: Literal["scenes"] = "scenes"
    kinds: dict[Literal["objects", "multi"], SceneKind] = Field(min_length=1)
    image_size: int = Field(64, ge=32, le=512)
    split: tuple[float, float, float] = (0.8, 0.1, 0.1)

    @field_validator("split")
    @classmethod
    def _split_sums_to_one(cls, v: tuple[float, float, float]) -> tuple[float, float, float]:
        return _check_split(v)

    @model_validator(mode="after")
    def _pairs_fit_the_test_split(self) -> "ScenesData":
        for kind, spec in self.kinds.items():
            n_test = int(spec.n_images * self.split[2])
            if spec.n_pairs > n_test:
                raise ValueError(f"kinds.{kind}.n_pairs={spec.n_pairs} > about {n_test} test images (one pair per test image)")
        return self


class FileData(Strict):
    """A real dataset on disk (pipeline.data loaders): `folders` (root/<class>/*.jpg), `cub`
    (CUB_200_2011 layout), `coco` (annotations/instances_<coco_split>.json + images), `syn`
    (a local synCUB/synCOCO copy, or its hub name jokl/syncub | jokl/syncoco with a network).
    Images are decoded once, resized to image_size and stored as uint8 by the data stage;
    unreadable images are skipped and listed (on_bad_image: skip) or stop the stage (fail)."""

    source: Literal["folders", "cub", "coco", "syn"]
    root: str = Field(min_length=1)
    image_size: int = Field(224, ge=32, le=1024)
    split: tuple[float, float, float] = (0.8, 0.1, 0.1)
    coco_split: str = "val2017"
    on_bad_image: Literal["skip", "fail"] = "skip"
    workers: int = Field(2, ge=0)

    @field_validator("split")
    @classmethod
    def _split_sums_to_one(cls, v: tuple[float, float, float]) -> tuple[float, float, float]:
        return _check_split(v)

    @model_validator(mode="after")
    def _root_exists(self) -> "FileData":
        if self.source == "syn" and self.root.startswith("jokl/"):
            return self  # a hub name: resolved by the loader, which fails fast offline
        if not Path(self.root).exists():
            raise ValueError(f"root: {self.root}: no such file or directory")
        return self


def _check_split(v: tuple[float, float, float]) -> tuple[float, float, float]:
    if min(v) <= 0 or abs(sum(v) - 1.0) > 1e-6:
        raise ValueError(f"train/val/test fractions must be positive and sum to 1, got {list(v)}")
    return v


DataParams = Annotated[Union[ScenesData, FileData], Field(discriminator="source")]


class EmbeddedEncoder(Strict):
    """The embedded offline CLIP-like model, trained by the encoder stage (image CNN aligned to frozen all-MiniLM-L6-v2)."""

    kind: Literal["embedded"] = "embedded"
    embed_dim: int = Field(64, ge=4, le=1024)
    width: int = Field(24, ge=4)
    epochs: int = Field(15, ge=1)
    batch_size: int = Field(128, ge=2)
    lr: float = Field(2e-3, gt=0)
    weight_decay: float = Field(1e-4, ge=0)

    @property
    def dim(self) -> int:
        return self.embed_dim


class PretrainedEncoder(Strict):
    """A pretrained model (pipeline.encoders.registry): open_clip (arch + weights tag or local file),
    hf_clip / dinov2 / blip (hub id or local folder). Weights come from the local cache or a path;
    offline, a missing hub id fails at once. `dim` (optional) lets the schema check k <= d early."""

    kind: Literal["open_clip", "hf_clip", "dinov2", "blip"]
    arch: str | None = None
    weights: str | None = None
    arch_config: str | None = None  # open_clip: a JSON architecture config file for a custom `arch`
    model: str | None = None
    dim: int | None = Field(None, ge=1)
    device: str = "auto"

    @model_validator(mode="after")
    def _names_its_model(self) -> "PretrainedEncoder":
        if self.kind == "open_clip" and not self.arch:
            raise ValueError("open_clip needs `arch` (e.g. ViT-B-32) and usually `weights` (a tag or a local file)")
        if self.kind != "open_clip" and not self.model:
            raise ValueError(f"{self.kind} needs `model` (a hub id or a local folder)")
        return self

    def spec(self) -> dict[str, Any]:
        """The registry spec (pipeline.encoders.registry.load_encoder)."""
        if self.kind == "open_clip":
            spec = {"kind": "open_clip", "arch": self.arch, "weights": self.weights, "device": self.device}
            return spec | ({"model_config": self.arch_config} if self.arch_config else {})
        return {"kind": self.kind, "model": self.model, "device": self.device}


EncoderParams = Annotated[Union[EmbeddedEncoder, PretrainedEncoder], Field(discriminator="kind")]


class ExtractParams(Strict):
    """batch_size: images per forward pass; chunk_rows: rows per zarr chunk of the embedding stores
    (the unit of resumption after a kill; 4096 x 4 bytes x d is ~1 MiB at d = 64)."""

    batch_size: int = Field(256, ge=1)
    chunk_rows: int = Field(4096, ge=1)


class TrainParams(Strict):
    """TrainSettings of pipeline.train, shared by every method (per-method overrides under methods.<m>.train)."""

    batch_size: int = Field(256, ge=1)
    epochs: int = Field(20, ge=1)
    lr: float = Field(5e-4, gt=0)
    warmup_frac: float = Field(0.05, ge=0, le=1)
    min_lr_frac: float = Field(0.1, ge=0, le=1)
    grad_clip: float = Field(1.0, ge=0)
    patience: int = Field(3, ge=1)
    init_samples: int = Field(20_000, ge=1)
    device: str = "auto"


class TrainOverrides(Strict):
    batch_size: int | None = Field(None, ge=1)
    epochs: int | None = Field(None, ge=1)
    lr: float | None = Field(None, gt=0)
    warmup_frac: float | None = Field(None, ge=0, le=1)
    min_lr_frac: float | None = Field(None, ge=0, le=1)
    grad_clip: float | None = Field(None, ge=0)
    patience: int | None = Field(None, ge=1)


class RotationSweep(Strict):
    methods: list[str] = Field(min_length=1)
    ks: list[int] = Field(min_length=1)


class SAESweep(Strict):
    methods: list[str] = Field(min_length=1)
    dict_sizes: list[int] = Field(min_length=1)
    ks: list[int] = Field(min_length=1)


class Sweep(Strict):
    rotation: RotationSweep
    sae: SAESweep


class EvaluateParams(Strict):
    """Evaluation settings.

    ks: K values of the FVU-vs-K curve (rotations re-sparsify at each; SAEs use their own k).
    betas / match_ks: FBMP rules reported (F_beta of the residual; coalition sizes); the
    recommended protocol (SPEC.md B) is beta 0.5, k 3, which TAPAScore uses (tapas_beta, tapas_k).
    max_match_rows: training-split rows used to fit coalitions (subsampled with the seed).
    cknna_max_n / fms_max_n: subsample sizes of the O(n^2) CKNNA and of the FMS trees.
    """

    ks: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32], min_length=1)
    batch_size: int = Field(1024, ge=1)
    betas: list[float] = Field(default_factory=lambda: [0.25, 0.5, 1.0], min_length=1)
    match_ks: list[int] = Field(default_factory=lambda: [1, 2, 3, 4, 5], min_length=1)
    tapas_beta: float = Field(0.5, gt=0)
    tapas_k: int = Field(3, ge=1)
    max_match_rows: int = Field(20_000, ge=10)
    cknna_k: int = Field(10, ge=1)
    cknna_max_n: int = Field(2000, ge=10)
    fms_max_n: int = Field(2000, ge=10)

    @model_validator(mode="after")
    def _tapas_rule_is_reported(self) -> "EvaluateParams":
        if self.tapas_k not in self.match_ks:
            raise ValueError(f"tapas_k={self.tapas_k} must be one of match_ks {self.match_ks}")
        if self.tapas_beta not in self.betas:
            raise ValueError(f"tapas_beta={self.tapas_beta} must be one of betas {self.betas}")
        if min(self.match_ks) < 1:
            raise ValueError(f"match_ks: every k must be >= 1, got {self.match_ks}")
        return self


class PlantedParams(Strict):
    """The planted-structure recovery benchmark (synthetic z = Q^T s + b + noise, k-sparse s)."""

    d: int = Field(32, ge=2, le=1024)
    n: int = Field(4000, ge=100)
    ks: list[int] = Field(default_factory=lambda: [4], min_length=1)
    noises: list[float] = Field(default_factory=lambda: [0.01, 0.1], min_length=1)
    epochs: int = Field(20, ge=1)
    methods: list[str] = Field(default_factory=lambda: ["cedar", "identity", "pca", "ica", "random_rotation"], min_length=1)

    @model_validator(mode="after")
    def _valid(self) -> "PlantedParams":
        from pipeline.models import ROTATION_METHODS

        bad = [m for m in self.methods if m not in ROTATION_METHODS]
        if bad:
            raise ValueError(f"methods: {bad} are not rotation methods ({', '.join(sorted(ROTATION_METHODS))})")
        if any(not 1 <= k <= self.d for k in self.ks):
            raise ValueError(f"ks: every k must be in 1..d={self.d}, got {self.ks}")
        return self


class DecoderParams(Strict):
    """The embedded caption decoder (pipeline.explain.captions.DecoderConfig; its docstring explains every
    field), trained by the captions stage on the training split's (image embedding, caption) pairs.
    The defaults train on the default preset's 3,600 pairs in about a minute on 2 CPU cores."""

    n_prefix: int = Field(4, ge=1)
    width: int = Field(128, ge=1)
    layers: int = Field(2, ge=1)
    heads: int = Field(4, ge=1)
    ff_mult: int = Field(2, ge=1)
    dropout: float = Field(0.1, ge=0, lt=1)
    max_tokens: int = Field(32, ge=2)
    epochs: int = Field(8, ge=1)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(2e-3, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_frac: float = Field(0.05, ge=0, lt=1)
    drop_max: float = Field(0.5, ge=0, lt=1)
    noise_std: float = Field(0.05, ge=0)
    min_count: int = Field(1, ge=1)
    device: str = "auto"

    @model_validator(mode="after")
    def _is_a_decoder_config(self) -> "DecoderParams":
        self.config()  # width % heads, device names: DecoderConfig's own checks, reported here
        return self

    def config(self) -> "DecoderConfig":
        """The `DecoderConfig` of these settings."""
        from pipeline.explain.captions import DecoderConfig

        return DecoderConfig(**self.model_dump())


class ExplainParams(Strict):
    """Explanations (pipeline.explanations): the caption decoder, and how much each evaluate stage explains.

    top_names: concepts naming each latent. top_m: named concepts per image scored by relevance.
    caption_images: test images captioned per kind and source (dense, sparse reconstruction, top-k in the
    original basis); with 300 the explanations add about 1 s to an SAE's evaluate stage on the default preset.
    caption_ks: extra k at which rotation runs are captioned (a "describes the image" curve; k > d skipped);
    each k adds two sources, about 0.5 s on the default preset (bench/bench_captions.py).
    latents / top_images: the report's latent list per run (most frequently active latents, their
    top-activating test images). examples: example test images per kind; pairs: intervention pairs per
    kind with the latents that switched (at most `switched` each way). max_rows: test images per kind used.
    """

    decoder: DecoderParams = DecoderParams()
    top_names: int = Field(5, ge=1)
    top_m: int = Field(5, ge=1)
    caption_images: int = Field(300, ge=1)
    caption_ks: list[int] = Field(default_factory=list)
    max_len: int = Field(24, ge=1)
    latents: int = Field(64, ge=1)
    top_images: int = Field(6, ge=1)
    examples: int = Field(8, ge=0)
    pairs: int = Field(4, ge=0)
    switched: int = Field(8, ge=1)
    max_rows: int = Field(2000, ge=1)

    @field_validator("caption_ks")
    @classmethod
    def _positive_ks(cls, v: list[int]) -> list[int]:
        if any(k < 1 for k in v):
            raise ValueError(f"every k must be >= 1, got {v}")
        return v

    def settings(self) -> "ExplainSettings":
        """The `pipeline.explanations.ExplainSettings` of these params."""
        from pipeline.explanations import ExplainSettings

        values = self.model_dump(exclude={"decoder"})
        return ExplainSettings(**{**values, "caption_ks": tuple(values["caption_ks"])})


class ReportParams(Strict):
    title: str = "CEDAR: interpretable embeddings"


class Params(Strict):
    seed: int = 0
    data: DataParams
    encoder: EncoderParams = EmbeddedEncoder()
    extract: ExtractParams = ExtractParams()
    train: TrainParams = TrainParams()
    sweep: Sweep
    methods: dict[str, dict[str, Any]] = Field(default_factory=dict)
    evaluate: EvaluateParams = EvaluateParams()
    planted: PlantedParams = PlantedParams()
    explain: ExplainParams = ExplainParams()
    report: ReportParams = ReportParams()

    @property
    def d(self) -> int | None:
        """The embedding dimension the models see, when params know it (embedded model, or `encoder.dim`)."""
        return self.encoder.dim

    @model_validator(mode="before")
    @classmethod
    def _default_tags(cls, raw: Any) -> Any:
        """`data.source` defaults to scenes and `encoder.kind` to embedded (the union's tags)."""
        if isinstance(raw, dict):
            raw = dict(raw)
            for key, tag, default in (("data", "source", "scenes"), ("encoder", "kind", "embedded")):
                if isinstance(raw.get(key), dict) and tag not in raw[key]:
                    raw[key] = {tag: default, **raw[key]}
        return raw

    @model_validator(mode="after")
    def _check_sweep(self) -> "Params":
        from pipeline.models import METHODS, ROTATION_METHODS

        problems: list[str] = []
        for i, method in enumerate(self.sweep.rotation.methods):
            if method not in ROTATION_METHODS:
                problems.append(f"sweep.rotation.methods[{i}]: {method!r} is not a rotation method ({', '.join(sorted(ROTATION_METHODS))})")
        for i, method in enumerate(self.sweep.sae.methods):
            if method not in METHODS or method in ROTATION_METHODS:
                sae = sorted(set(METHODS) - ROTATION_METHODS)
                problems.append(f"sweep.sae.methods[{i}]: {method!r} is not an SAE method ({', '.join(sae)})")
        for i, k in enumerate(self.sweep.rotation.ks):
            if k < 1 or (self.d is not None and k > self.d):
                problems.append(f"sweep.rotation.ks[{i}]: k={k} must be in 1..d={self.d} (the encoder's embedding dimension)")
        for i, size in enumerate(self.sweep.sae.dict_sizes):
            if size < 1:
                problems.append(f"sweep.sae.dict_sizes[{i}]: dictionary size must be >= 1, got {size}")
        for i, k in enumerate(self.sweep.sae.ks):
            too_big = [s for s in self.sweep.sae.dict_sizes if k > s]
            if k < 1:
                problems.append(f"sweep.sae.ks[{i}]: k must be >= 1, got {k}")
            elif too_big:
                problems.append(f"sweep.sae.ks[{i}]: k={k} > dictionary size {min(too_big)} (sweep.sae.dict_sizes); every k must fit every size")
        for name, values in [("sweep.rotation.methods", self.sweep.rotation.methods), ("sweep.sae.methods", self.sweep.sae.methods),
                             ("sweep.rotation.ks", self.sweep.rotation.ks), ("sweep.sae.ks", self.sweep.sae.ks),
                             ("sweep.sae.dict_sizes", self.sweep.sae.dict_sizes)]:
            if len(set(values)) != len(values):
                problems.append(f"{name}: duplicate values {values}")
        for i, k in enumerate(self.evaluate.ks):
            if k < 1:
                problems.append(f"evaluate.ks[{i}]: k must be >= 1, got {k}")
        swept = [*self.sweep.rotation.methods, *self.sweep.sae.methods]
        for method in swept:
            if method not in self.methods:
                problems.append(f"methods.{method}: missing (every swept method needs an entry; `{method}: {{}}` uses the defaults)")
        for method, options in self.methods.items():
            if method not in METHODS:
                problems.append(f"methods.{method}: unknown method (known: {', '.join(sorted(METHODS))})")
                continue
            problems.extend(_check_options(method, options or {}))
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def method_options(self, method: str) -> dict[str, Any]:
        """Validated constructor options of `method` (without its `train` overrides)."""
        options = dict(self.methods.get(method) or {})
        options.pop("train", None)
        return options_model(method).model_validate(options).model_dump()

    def train_settings(self, method: str) -> TrainSettings:
        """The loop settings for `method`: `train:` with the method's `train:` overrides applied."""
        overrides = TrainOverrides.model_validate((self.methods.get(method) or {}).get("train") or {})
        merged = {**self.train.model_dump(), **overrides.model_dump(exclude_none=True)}
        return TrainSettings(**merged, seed=self.seed, val_fraction=self.data.split[1])

    def cell(self, method: str, size: int | None, k: int) -> "Run":
        """The grid cell named on a stage's command line; a clear error if the sweep does not contain it."""
        for run in self.runs():
            if run.method == method and run.k == k and (run.rotation or run.size == size):
                return run
        raise ValueError(f"no grid cell method={method} size={size} k={k} in the params sweep")

    def runs(self) -> list["Run"]:
        """Every cell of the grid, in params order: rotations first, then SAEs."""
        rotations = [Run(m, self.d or 0, k, rotation=True) for m in self.sweep.rotation.methods for k in self.sweep.rotation.ks]
        saes = [Run(m, s, k, rotation=False) for m in self.sweep.sae.methods for s in self.sweep.sae.dict_sizes for k in self.sweep.sae.ks]
        return rotations + saes


@dataclass(frozen=True)
class Run:
    """One grid cell. `name` is the DVC matrix suffix and the run's directory name."""

    method: str
    size: int
    k: int
    rotation: bool

    @property
    def name(self) -> str:
        return f"{self.method}-{self.k}" if self.rotation else f"{self.method}-{self.size}-{self.k}"


@cache
def options_model(method: str) -> type[BaseModel]:
    """A pydantic model built from the keyword-only parameters of the method's class constructor."""
    from pipeline.models import model_class

    cls = model_class(method)
    fields: dict[str, Any] = {}
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            annotation = p.annotation if p.annotation is not inspect.Parameter.empty else Any
            if isinstance(annotation, str):
                annotation = eval(annotation, vars(inspect.getmodule(cls)))  # postponed annotations of the model module
            fields[name] = (annotation, p.default)
    return create_model(f"{cls.__name__}Options", __config__=ConfigDict(extra="forbid"), **fields)


def _check_options(method: str, options: dict[str, Any]) -> list[str]:
    if not isinstance(options, dict):
        return [f"methods.{method}: expected a mapping of options, got {type(options).__name__}"]
    problems: list[str] = []
    opts = dict(options)
    train = opts.pop("train", None)
    try:
        options_model(method).model_validate(opts)
    except ValidationError as e:
        problems.extend(_format(e, f"methods.{method}"))
    if train is not None:
        try:
            TrainOverrides.model_validate(train)
        except ValidationError as e:
            problems.extend(_format(e, f"methods.{method}.train"))
    return problems


#: (key, tag) pairs pydantic puts in error locations for tagged unions; dropped so messages name the user's keys.
_UNION_TAGS = {("data", t) for t in ("scenes", "folders", "cub", "coco", "syn")} | {
    ("encoder", t) for t in ("embedded", "open_clip", "hf_clip", "dinov2", "blip")}


def _format(error: ValidationError, prefix: str = "") -> list[str]:
    lines = []
    for e in error.errors():
        parts = [p for i, p in enumerate(e["loc"]) if not (i and (e["loc"][i - 1], p) in _UNION_TAGS)]
        loc = ".".join(str(part) if not isinstance(part, int) else f"[{part}]" for part in parts).replace(".[", "[")
        key = ".".join(p for p in (prefix, loc) if p)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        if not loc:  # our own cross-field validator: its lines already name their keys
            lines.extend(msg.splitlines())
        else:
            lines.append(f"{key}: {msg}" + (f" (got {e['input']!r})" if e["type"] not in ("extra_forbidden", "missing", "value_error") else ""))
    return lines


def validate_params(raw: Any, source: str = "params.yaml") -> Params:
    """Validate a parsed params mapping; ParamsError lists every problem, one line each, prefixed by `source`."""
    if not isinstance(raw, dict):
        raise ParamsError(f"{source}: expected a mapping at the top level, got {type(raw).__name__}")
    try:
        return Params.model_validate(raw)
    except ValidationError as e:
        raise ParamsError("\n".join(f"{source}: {line}" for line in _format(e))) from None


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate params.yaml (clear errors for a missing file or broken YAML)."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path}: no such file (run `cedar preset default` to create one)")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ParamsError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    return validate_params(raw, str(path))
