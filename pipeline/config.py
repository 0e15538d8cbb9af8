"""The schema of params.yaml, composed from the settings every component owns; every stage validates through it.

Each section is one component's `@settings` dataclass (`pipeline.settings`), declared in its package's light
`options` module (pydantic and numpy only: loading this schema, as every stage and `cedar validate` do, loads no
torch, scikit-learn or zarr): `data` (`pipeline.data.options`), `encoder` (`pipeline.encoders.options`:
`EmbeddedSettings` or `PretrainedSettings`), `train` (`pipeline.training.options.TrainSettings`), `sweep`
(`pipeline.grid`), `methods.<m>` (the method's options class, `pipeline.models.options`, plus an optional partial
`train:` override whose `lr` may be a list: the method's learning-rate axis, `Params.train_candidates`), `evaluate` and `planted` (`pipeline.scoring.options`), `captions` and `explain`
(`pipeline.explain.options`); `extract` and `report` are the stages' own, declared here, and so is `threads`, the
CPU threads every stage computes with (`stages.runner.use_threads`: from params, never from the machine or the
batch job, so that a stage writes the same bytes wherever it runs; every stage declares it in dvc.yaml, so a new
value reruns them). This module adds only what no single component can check: the cross-field rules of the sweep
grid.

Unknown keys, duplicate keys, wrong types and impossible values fail with one line per problem naming the file,
the key and the value (e.g. `params.yaml: sweep.sae.ks[1]: k=512 > dictionary size 256`), before any work starts.
Beyond each component's own rules this module refuses what only the whole file shows: a grid cell that cannot
exist, `evaluate.ks` / `explain.caption_ks` beyond the latents of the rotation runs (d), `evaluate.match_ks` beyond
the smallest latent count, splits too small for the evaluation (`split_problems`: exact for the scene world
here; a real dataset's file table is counted by `pipeline.resources.resource_problems`, which `cedar validate` also
uses to report pretrained weights that are not available offline, and by the data stage once the images are read),
and training batches the data or the memory budget cannot hold (`batch_problems`: a batch larger than the training
split where params give its size; batches in flight beyond a `train.feed_memory` given as a size; a fraction of
free memory is checked by `pipeline.resources` and again by the stage, `pipeline.training.feed.plan_feed`).

Sweep design: the grid is two DVC `matrix` stages — rotations (CEDAR and the rotation baselines, one latent per
embedding dimension, so only k varies) and SAEs (method x dictionary size x k). A k larger than a dictionary size
(or than d for rotations) is rejected here, not skipped: DVC expands the full cross product, so an impossible cell
would otherwise fail late.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipeline.data.options import DataSettings, ScenesSettings, SyntheticSettings
from pipeline.encoders.options import EmbeddedSettings, PretrainedSettings
from pipeline.explain.options import DecoderSettings, ExplainSettings
from pipeline.grid import Cell, Sweep, cells
from pipeline.models.options import OPTIONS, ROTATION_METHODS, options_class
from pipeline.scoring.options import EvaluateSettings, PlantedSettings
from pipeline.settings import NonNegativeInt, PositiveInt, settings
from pipeline.training.options import BATCHES_IN_FLIGHT, TrainSettings, lr_axis, memory_bytes


class ParamsError(ValueError):
    """params.yaml is malformed; the message has one line per problem, each naming the key."""


EncoderSettings = Annotated[Union[EmbeddedSettings, PretrainedSettings], Field(discriminator="kind")]


@settings
class ExtractSettings:
    """The extract stage: batch_size images per forward pass; chunk_rows rows per zarr chunk of the embedding
    stores (the unit of resumption after a kill; 4096 x 4 bytes x d is ~1 MiB at d = 64)."""

    batch_size: PositiveInt = 256
    chunk_rows: PositiveInt = 4096


@settings
class ReportSettings:
    """The report stage: the page's title."""

    title: str = "CEDAR: interpretable embeddings"


class Params(BaseModel):
    """All of params.yaml (see the module docstring for where each section's settings live)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: NonNegativeInt = 0
    threads: PositiveInt = 1
    data: DataSettings
    encoder: EncoderSettings = EmbeddedSettings()
    extract: ExtractSettings = ExtractSettings()
    train: TrainSettings = TrainSettings()
    sweep: Sweep
    methods: dict[str, Any] = Field(default_factory=dict)
    evaluate: EvaluateSettings = EvaluateSettings()
    planted: PlantedSettings = PlantedSettings()
    captions: DecoderSettings = DecoderSettings()
    explain: ExplainSettings = ExplainSettings()
    report: ReportSettings = ReportSettings()

    @property
    def d(self) -> int | None:
        """The embedding dimension the models see, when params know it (embedded model, `encoder.dim`, or the
        synthetic source's `data.d`, whose embeddings need no encoder)."""
        return self.data.d if isinstance(self.data, SyntheticSettings) else self.encoder.dim

    @model_validator(mode="before")
    @classmethod
    def _default_tags(cls, raw: Any) -> Any:
        """`data.source` defaults to scenes and `encoder.kind` to embedded (the unions' tags)."""
        if isinstance(raw, dict):
            raw = dict(raw)
            for key, tag, default in (("data", "source", "scenes"), ("encoder", "kind", "embedded")):
                if isinstance(raw.get(key), dict) and tag not in raw[key]:
                    raw[key] = {tag: default, **raw[key]}
        return raw

    @model_validator(mode="after")
    def _check_sweep(self) -> "Params":
        problems: list[str] = []
        rotation, sae = self.sweep.rotation, self.sweep.sae
        for i, method in enumerate(rotation.methods):
            if method not in ROTATION_METHODS:
                problems.append(f"sweep.rotation.methods[{i}]: {method!r} is not a rotation method ({', '.join(sorted(ROTATION_METHODS))})")
        for i, method in enumerate(sae.methods):
            if method not in OPTIONS or method in ROTATION_METHODS:
                problems.append(f"sweep.sae.methods[{i}]: {method!r} is not an SAE method ({', '.join(sorted(set(OPTIONS) - ROTATION_METHODS))})")
        for i, k in enumerate(rotation.ks):
            if k < 1 or (self.d is not None and k > self.d):
                problems.append(f"sweep.rotation.ks[{i}]: k={k} must be in 1..d={self.d} (the encoder's embedding dimension)")
        for i, size in enumerate(sae.dict_sizes):
            if size < 1:
                problems.append(f"sweep.sae.dict_sizes[{i}]: dictionary size must be >= 1, got {size}")
        for i, k in enumerate(sae.ks):
            too_big = [s for s in sae.dict_sizes if k > s]
            if k < 1:
                problems.append(f"sweep.sae.ks[{i}]: k must be >= 1, got {k}")
            elif too_big:
                problems.append(f"sweep.sae.ks[{i}]: k={k} > dictionary size {min(too_big)} (sweep.sae.dict_sizes); every k must fit every size")
        for name, values in [("sweep.rotation.methods", rotation.methods), ("sweep.sae.methods", sae.methods), ("sweep.rotation.ks", rotation.ks),
                             ("sweep.sae.ks", sae.ks), ("sweep.sae.dict_sizes", sae.dict_sizes)]:
            if len(set(values)) != len(values):
                problems.append(f"{name}: duplicate values {list(values)}")
        for method in [*rotation.methods, *sae.methods]:
            if method in OPTIONS and method not in self.methods:  # an unknown one is reported above
                problems.append(f"methods.{method}: missing (every swept method needs an entry; `{method}: {{}}` uses the defaults)")
        for method, options in self.methods.items():
            if method not in OPTIONS:
                problems.append(f"methods.{method}: unknown method (known: {', '.join(sorted(OPTIONS))})")
                continue
            problems.extend(_check_options(method, options if options is not None else {}, self.train))
        problems.extend(self._latent_counts())
        if isinstance(self.data, ScenesSettings):
            problems.extend(split_problems(self.data.split_counts(self.seed), self))
        if not problems:  # the loop settings of every method are valid here
            problems.extend(batch_problems(self, self.train_rows))
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _latent_counts(self) -> list[str]:
        """K values of the evaluation that no run of the grid has latents for (they would be skipped silently)."""
        problems = []
        if self.sweep.rotation.methods and self.d is not None:
            for name, values in (("evaluate.ks", self.evaluate.ks), ("explain.caption_ks", self.explain.caption_ks)):
                problems += [f"{name}[{i}]: K={k} > d={self.d}, the latent count of the rotation runs (sweep.rotation)"
                             for i, k in enumerate(values) if k > self.d]
        sizes = [size for size in (self.d if self.sweep.rotation.methods else None, *self.sweep.sae.dict_sizes) if size is not None]
        if sizes and max(self.evaluate.match_ks) > min(sizes):
            problems.append(f"evaluate.match_ks: coalitions of {max(self.evaluate.match_ks)} latents > {min(sizes)}, the smallest latent count "
                            "of the grid")
        return problems

    @property
    def train_rows(self) -> int | None:
        """Rows of the training split when params alone say it (the scene world, the synthetic source), else None."""
        if isinstance(self.data, ScenesSettings):
            return sum(train for train, _, _ in self.data.split_counts(self.seed).values())
        if isinstance(self.data, SyntheticSettings):
            return int(self.data.n * self.data.split[0])
        return None

    def trained_methods(self) -> list[str]:
        """The swept methods that make optimiser steps (the fixed bases, `FIXED_BASES`, are fitted, not trained)."""
        return [m for m in dict.fromkeys([*self.sweep.rotation.methods, *self.sweep.sae.methods]) if m not in FIXED_BASES]

    def method_options(self, method: str) -> dict[str, Any]:
        """Validated options of `method` (its `Options` fields, without the `train` override) as a dict."""
        options = dict(self.methods.get(method) or {})
        options.pop("train", None)
        return dataclasses.asdict(options_class(method)(**options))

    def train_settings(self, method: str) -> TrainSettings:
        """The loop settings for `method`: `train:` with the method's `train:` overrides applied (with a learning-rate
        axis, the first candidate's; `train_candidates` gives them all)."""
        return self.train_candidates(method)[0]

    def train_candidates(self, method: str) -> tuple[TrainSettings, ...]:
        """The loop settings of each run a cell of `method` trains: one, or one per learning rate when the method's
        `train.lr` is a list (the learning-rate axis; `pipeline.training.lr_axis` keeps the best on validation)."""
        override = dict((self.methods.get(method) or {}).get("train") or {})
        rates = lr_axis(override.pop("lr", self.train.lr))
        base = dataclasses.replace(self.train, **override)
        return tuple(dataclasses.replace(base, lr=lr) for lr in rates)

    def cell(self, method: str, size: int | None, k: int) -> Cell:
        """The grid cell named on a stage's command line; a clear error if the sweep does not contain it."""
        for cell in self.cells():
            if cell.method == method and cell.k == k and (cell.rotation or cell.size == size):
                return cell
        raise ValueError(f"no grid cell method={method} size={size} k={k} in the params sweep")

    def cells(self) -> list[Cell]:
        """Every cell of the grid, in params order: rotations first, then SAEs."""
        return cells(self.sweep, self.d)


def _check_options(method: str, options: Any, train: TrainSettings) -> list[str]:
    """Problems of one `methods.<method>` entry: its options against the class's `Options`, its `train:` override
    against `TrainSettings` (merged over params' `train:`)."""
    if not isinstance(options, dict):
        return [f"methods.{method}: expected a mapping of options, got {type(options).__name__}"]
    problems: list[str] = []
    opts = dict(options)
    override = opts.pop("train", None)
    try:
        options_class(method)(**opts)
    except ValidationError as e:
        problems.extend(_format(e, f"methods.{method}"))
    if override is not None:
        if not isinstance(override, dict):
            return problems + [f"methods.{method}.train: expected a mapping of loop settings, got {type(override).__name__}"]
        override = dict(override)
        try:
            override["lr"] = lr_axis(override.get("lr", train.lr))[0]  # a list is the learning-rate axis
        except ValueError as e:
            problems.extend(f"methods.{method}.train.lr{line}" for line in str(e).splitlines())
            override.pop("lr")
        try:
            dataclasses.replace(train, **override)
        except TypeError as e:  # an unknown field name
            problems.append(f"methods.{method}.train: {str(e).split('got ')[-1]}: unknown key")
        except ValidationError as e:
            problems.extend(_format(e, f"methods.{method}.train"))
    return problems


#: (key, tag) pairs pydantic puts in error locations for tagged unions; dropped so messages name the user's keys.
_UNION_TAGS = {("data", t) for t in ("scenes", "folders", "cub", "coco", "syn", "synthetic")} | {
    ("encoder", t) for t in ("embedded", "open_clip", "hf_clip", "dinov2", "blip")}


def _format(error: ValidationError, prefix: str = "") -> list[str]:
    lines = []
    for e in error.errors():
        parts = [p for i, p in enumerate(e["loc"]) if not (i and (e["loc"][i - 1], p) in _UNION_TAGS) and p != "[key]"]
        loc = ".".join(str(part) if not isinstance(part, int) else f"[{part}]" for part in parts).replace(".[", "[")
        key = ".".join(p for p in (prefix, loc) if p)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            msg = "unknown key"
        if e["type"] == "union_tag_invalid":  # name the tag's key and value, not the whole mapping
            tag = e["ctx"]["discriminator"].strip("'")
            lines.append(f"{key}.{tag}: unknown {tag} {e['ctx']['tag']!r} (expected one of {e['ctx']['expected_tags']})")
            continue
        if not loc:  # our own cross-field validator: its lines already name their keys
            lines.extend(msg.splitlines())
        else:
            lines.append(f"{key}: {msg}" + (f" (got {e['input']!r})" if e["type"] not in ("extra_forbidden", "unexpected_keyword_argument", "missing", "value_error") else ""))
    return lines


#: rotation methods with nothing to train (their `SparseModel.trainable` is False): no batches, no batch-size rule
FIXED_BASES = ROTATION_METHODS - {"cedar"}


def batch_problems(params: "Params", train_rows: int | None, free: dict[str, int] | None = None) -> list[str]:
    """Training batches the data or the budget cannot hold, one line each naming the key: a batch larger than the
    `train_rows` rows of the training split (when known), and `BATCHES_IN_FLIGHT` batches of d float32 values per row
    beyond `train.feed_memory` (a size; a fraction of free memory only where `free` gives the free bytes of the
    method's `train.device`)."""
    problems: dict[str, list[str]] = {}  # the problem -> the methods it concerns
    for method in params.trained_methods():
        settings = params.train_settings(method)
        key = f"methods.{method}.train" if "batch_size" in ((params.methods.get(method) or {}).get("train") or {}) else "train"
        if train_rows is not None and settings.batch_size > train_rows:
            problems.setdefault(f"{key}.batch_size: {settings.batch_size} rows per step, but the training split has only {train_rows} rows "
                                f"(data.split {list(params.data.split)})", []).append(method)
        available = (free or {}).get(settings.device)
        if params.d is not None and (available is not None or isinstance(settings.feed_memory, str)):
            need = BATCHES_IN_FLIGHT * settings.batch_size * params.d * 4
            budget = memory_bytes(settings.feed_memory, available or 0)
            if need > budget:
                problems.setdefault(f"{key}.batch_size: {BATCHES_IN_FLIGHT} batches in flight of {settings.batch_size} rows of d = {params.d} "
                                    f"float32 values need {_size(need)}, more than train.feed_memory = {settings.feed_memory} allows "
                                    f"({_size(budget)})", []).append(method)
    return [f"{text} (training {', '.join(methods)})" for text, methods in problems.items()]


def _size(n: float) -> str:
    """Bytes in words: "512 B", "24.0 KiB", "1.5 GiB"."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError


def split_problems(counts: dict[str, tuple[int, int, int]], params: "Params") -> list[str]:
    """Splits too small for what the params run on them, one line each. counts: kind -> images in the (train,
    validation, test) splits. Each kind needs a training image (its concepts are matched there) and
    max(4, evaluate.cknna_k + 1) test images (CKNNA: k neighbours of every row, at least 4 rows); training needs a
    validation image."""
    def key(kind: str) -> str:
        return f"data.kinds.{kind}.n_images" if isinstance(params.data, ScenesSettings) else f"data.root: {params.data.root}"

    need = max(4, params.evaluate.cknna_k + 1)
    problems = []
    for kind, (train, _, test) in counts.items():
        if train < 1:
            problems.append(f"{key(kind)}: no training image of kind {kind} (split {list(params.data.split)}); its concepts are matched on "
                            "the training split")
        if test < need:
            problems.append(f"{key(kind)}: {test} test images of kind {kind} (split {list(params.data.split)}); the evaluation needs at least "
                            f"{need} per kind (CKNNA with evaluate.cknna_k = {params.evaluate.cknna_k} neighbours)")
    if counts and sum(val for _, val, _ in counts.values()) < 1:
        problems.append(f"data.split: {list(params.data.split)} leaves no validation image; training validates on that split")
    return problems


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
        raw = read_yaml(path.read_text(), str(path))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        context = f" ({e.context}, line {e.context_mark.line + 1})" if e.context and e.context_mark else ""
        raise ParamsError(f"{path}{where}: not valid YAML: {e.problem}{context}") from None
    except yaml.YAMLError as e:
        raise ParamsError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    return validate_params(raw, str(path))


def read_yaml(text: str, source: str) -> Any:
    """Parse YAML like `yaml.safe_load`, but a key given twice in one mapping is a ParamsError naming both lines
    (YAML would keep the last value silently; DVC refuses the file)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        problems = _duplicate_keys(node, "", source) if node is not None else []
        if problems:
            raise ParamsError("\n".join(problems))
        return loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()


def _duplicate_keys(node: yaml.Node, path: str, source: str) -> list[str]:
    """Lines naming every key that appears twice in one mapping of the YAML tree under `node` (at key path `path`)."""
    problems = []
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            where = f"{path}.{key}" if path else key
            line = key_node.start_mark.line + 1
            if key in first:
                problems.append(f"{source}:{line}: {where}: duplicate key (first given on line {first[key]}; YAML would keep only the last value)")
            first.setdefault(key, line)
            problems += _duplicate_keys(value_node, where, source)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            problems += _duplicate_keys(item, f"{path}[{i}]", source)
    return problems
