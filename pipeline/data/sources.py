"""The data sources params.yaml can name (`data:`), and reading one into the parts of a dataset.

- `scenes` (`ScenesSettings`): the procedural offline world (`pipeline.data.world`): `objects` scenes (CUB-like,
  one-hot attribute families, attribute-edit pairs) and/or `multi` scenes (COCO-like, multi-label categories,
  object-removal pairs), rendered from the seed.
- `folders`, `cub`, `coco`, `syn` (`FileSettings`): a real dataset on disk (the loaders beside this module). Its
  image files are decoded once in DataLoader workers, resized to `image_size` and kept as uint8; undecodable images
  are skipped and listed (`on_bad_image: skip`, labels stay aligned because their rows are dropped) or stop the
  stage (`fail`).

- `synthetic` (`SyntheticSettings`): planted sparse concepts written straight to embeddings (no images, no encoder;
  `pipeline.data.synthetic`), so that the training and evaluation half of the pipeline runs, and is benchmarked,
  at any size on any machine; it doubles as the planted-recovery benchmark at scale.

`read_source(settings, seed)` returns what `pipeline.data.dataset.write_dataset` stores (images and labels in
memory); the synthetic source is written chunk by chunk by `pipeline.data.synthetic.write_synthetic` instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import AfterValidator, Field, Strict, model_validator
from tqdm.auto import tqdm

from pipeline.data.coco import load_coco
from pipeline.data.cub import load_cub
from pipeline.data.folders import load_folders
from pipeline.data.images import SquareUint8, iter_image_batches
from pipeline.data.phrases import name_phrases
from pipeline.data.syn import load_syn
from pipeline.data.table import IMAGE_EXTENSIONS, assign_split
from pipeline.data.world import scenes as world
from pipeline.data.world.captions import attribute_phrases, zero_shot_prompts
from pipeline.data.world.vocabulary import DISTRACTORS, vocabulary
from pipeline.settings import Float, NonNegativeFloat, NonNegativeInt, settings
from pipeline.store import Store, StoreWriter

log = logging.getLogger(__name__)

def _check_split(value: tuple[float, float, float]) -> tuple[float, float, float]:
    if min(value) <= 0 or abs(sum(value) - 1.0) > 1e-6:
        raise ValueError(f"train/val/test fractions must be positive and sum to 1, got {list(value)}")
    return value


#: train / validation / test fractions: positive, summing to 1
Split = Annotated[tuple[Float, Float, Float], AfterValidator(_check_split)]


@settings
class SceneKind:
    """How many scenes of one kind to render, and how many intervention pairs (from its test split)."""

    n_images: Annotated[int, Strict(), Field(ge=20)]
    n_pairs: NonNegativeInt = 0
    max_objects: Annotated[int, Strict(), Field(ge=1, le=9)] = 5  # multi-object scenes only


@settings
class ScenesSettings:
    """The procedural offline world: `kinds` (objects and/or multi), square images of `image_size` pixels, the
    train / validation / test fractions `split`."""

    kinds: dict[Literal["objects", "multi"], SceneKind] = Field(min_length=1)
    source: Literal["scenes"] = "scenes"
    image_size: Annotated[int, Strict(), Field(ge=32, le=512)] = 64
    split: Split = (0.8, 0.1, 0.1)

    @model_validator(mode="after")
    def _pairs_fit_the_test_split(self) -> "ScenesSettings":
        for kind, spec in self.kinds.items():
            n_test = int(spec.n_images * self.split[2])
            if spec.n_pairs > n_test:
                raise ValueError(f"kinds.{kind}.n_pairs={spec.n_pairs} > about {n_test} test images (one pair per test image)")
        return self


@settings
class FileSettings:
    """A real dataset on disk: `folders` (root/<class>/*.jpg), `cub` (CUB_200_2011 layout), `coco`
    (annotations/instances_<coco_split>.json + images), `syn` (a local synCUB/synCOCO copy, or its hub name
    jokl/syncub | jokl/syncoco with a network). workers: DataLoader processes that decode the images.
    split: train / validation / test fractions (folders and coco: stratified by class; syn: of the distinct base
    images, so that models train on them; cub keeps its own train/test split and takes the validation fraction
    from its training images)."""

    source: Literal["folders", "cub", "coco", "syn"]
    root: Annotated[str, Field(min_length=1)]
    image_size: Annotated[int, Strict(), Field(ge=32, le=1024)] = 224
    split: Split = (0.8, 0.1, 0.1)
    coco_split: str = "val2017"
    on_bad_image: Literal["skip", "fail"] = "skip"
    workers: NonNegativeInt = 2

    @property
    def on_hub(self) -> bool:
        """Whether `root` is a hub name (jokl/syncub, jokl/syncoco) that the loader fetches, not a local folder."""
        return self.source == "syn" and self.root.startswith("jokl/")

    @model_validator(mode="after")
    def _root_has_images(self) -> "FileSettings":
        if self.on_hub:
            return self  # resolved by the loader, which fails fast offline
        root = Path(self.root)
        if not root.exists():
            raise ValueError(f"root: {self.root}: no such file or directory")
        if not any(p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file() for p in root.rglob("*")):  # stops at the first image
            raise ValueError(f"root: {self.root}: no image files under it (suffixes {', '.join(IMAGE_EXTENSIONS)})")
        return self


@settings
class SyntheticSettings:
    """Planted sparse concepts, written straight to embeddings (`pipeline.data.synthetic` has the model).

    n: rows (embeddings). d: their dimension. families x values: one-hot attribute families (families * values binary
    concepts, each a random unit direction; CUB-like 28 x 11 by default); every row has one value of every family
    active with a magnitude in [0.5, 1.5]. noise: standard deviation of the Gaussian noise per coordinate. offset:
    norm of a constant vector added to every row (CLIP embeddings lie far from the origin). n_pairs: intervention
    pairs, each a test row with one family's value swapped. The data stage draws and writes a block of rows at a time
    (memory: one block, whatever n is).
    """

    source: Literal["synthetic"]
    n: Annotated[int, Strict(), Field(ge=20)]
    d: Annotated[int, Strict(), Field(ge=2)] = 768
    families: Annotated[int, Strict(), Field(ge=1)] = 28
    values: Annotated[int, Strict(), Field(ge=2)] = 11
    noise: NonNegativeFloat = 0.05
    offset: NonNegativeFloat = 1.0
    n_pairs: NonNegativeInt = 1000
    split: Split = (0.8, 0.1, 0.1)

    @model_validator(mode="after")
    def _pairs_fit_the_test_split(self) -> "SyntheticSettings":
        n_test = int(self.n * self.split[2])
        if self.n_pairs > n_test:
            raise ValueError(f"n_pairs={self.n_pairs} > about {n_test} test rows (one pair per test row)")
        return self


DataSettings = Annotated[ScenesSettings | FileSettings | SyntheticSettings, Field(discriminator="source")]


@dataclass
class Source:
    """A data source read into what the dataset stores: (images and labels, pairs) per kind, the concept
    vocabulary, zero-shot prompts per family, the rule for caption phrases, and the images that were skipped."""

    parts: list[tuple[Any, Any]]
    vocabulary: list[str]
    prompts: dict[str, list[str]]
    phrases: Callable[[list[str]], list[list[str]]]
    bad_images: list[dict[str, Any]] = field(default_factory=list)


def render_kind(kind: str, spec: SceneKind, data: ScenesSettings, seed: int) -> tuple[world.SceneSet, world.PairSet]:
    """One kind of scene and its intervention pairs (from its test split)."""
    start = time.perf_counter()
    split = tuple(data.split)
    if kind == "objects":
        scenes = world.generate_objects(spec.n_images, image_size=data.image_size, seed=seed, split=split)
        pairs = world.object_pairs(scenes, min(spec.n_pairs, int((scenes.split == 2).sum())), seed=seed + 1)
    else:
        scenes = world.generate_multi(spec.n_images, image_size=data.image_size, seed=seed, split=split, max_objects=spec.max_objects)
        pairs = world.multi_pairs(scenes, min(spec.n_pairs, int((scenes.split == 2).sum())), seed=seed + 1)
    log.info("%s: rendered %d images and %d pairs in %.1fs", kind, len(scenes.images), len(pairs.base_index), time.perf_counter() - start)
    return scenes, pairs


def decode(paths: list, size: int, data: FileSettings, desc: str, out: StoreWriter | None = None) -> tuple[np.ndarray | Store, list[dict]]:
    """Decode image files to uint8 (m, size, size, 3) in DataLoader workers; returns the images of the decodable
    files (in order) and the bad ones as {index, path, reason}. With `out` (a StoreWriter of rows (size, size, 3)) the
    images are appended to it batch by batch as they arrive, in row order, and the finished store is returned:
    memory is then a few batches whatever the number of images (ImageNet's 1.28 M at 224 px would be 193 GB)."""
    pixels = np.zeros((0 if out is not None else len(paths), size, size, 3), dtype=np.uint8)
    ok = np.zeros(len(paths), dtype=bool)
    bad: list[dict] = []
    batches = iter_image_batches(paths, SquareUint8(size), batch_size=64, num_workers=data.workers, on_bad_image=data.on_bad_image, draft=size)
    for batch in tqdm(batches, total=-(-len(paths) // 64), desc=desc, unit="batch"):
        if out is not None:
            out.append(batch.pixels.numpy().reshape(-1, size, size, 3))
        else:
            pixels[batch.indices] = batch.pixels.numpy()
        ok[batch.indices] = True
        bad += [{"index": b.index, "path": b.path, "reason": b.reason} for b in batch.bad]
    return (out.finalize() if out is not None else pixels[ok]), bad


def read_table(data: FileSettings, seed: int, check: bool) -> tuple[Any, Any]:
    """The loader's (ImageTable, PairTable or None) of a real dataset: file lists, labels and the split, no pixels.
    check: open every image header first (the loader names the first bad file)."""
    if data.source == "folders":
        return load_folders(data.root, split=tuple(data.split), seed=seed, check=check), None
    if data.source == "cub":
        return load_cub(data.root, val_fraction=data.split[1], seed=seed, check=check), None
    if data.source == "coco":
        return load_coco(data.root, split_name=data.coco_split, split=tuple(data.split), seed=seed, check=check), None
    table, pair_table = load_syn(data.root, check=check)
    # the benchmark's base images are split by `split` like any source, so models can train on them (the loader marks
    # them all test: the pairs are the evaluation set, and every pair is scored whatever its base's split)
    table.split = assign_split(np.zeros(len(table.paths), dtype=np.int64), tuple(data.split), seed)
    return table, pair_table


def split_counts(data: ScenesSettings | FileSettings, seed: int) -> dict[str, tuple[int, int, int]]:
    """Images per (train, validation, test) split of each kind the source gives, before any image is read: exact for
    scenes (the world's split rule), from the loader's file table for a real dataset (undecodable files not yet
    dropped)."""
    if isinstance(data, ScenesSettings):
        splits = {kind: assign_split(np.zeros(spec.n_images), tuple(data.split), seed) for kind, spec in data.kinds.items()}
    else:
        table, _ = read_table(data, seed, check=False)
        splits = {table.kind: table.split}
    return {kind: tuple(int(c) for c in np.bincount(split, minlength=3)) for kind, split in splits.items()}


def load_files(data: FileSettings, seed: int, images_out: Path | None = None, fingerprint: dict[str, Any] | None = None) -> tuple[Any, Any, list[dict]]:
    """A real dataset as (SceneSet-like part, PairSet-like pairs, bad images). images_out: where to stream the
    decoded images (a row store, fingerprinted with `fingerprint`); the part's `images` is then that store."""
    # open every image header up front only when a bad one must stop the stage
    table, pair_table = read_table(data, seed, check=data.on_bad_image == "fail")
    writer = None if images_out is None else StoreWriter(images_out, (data.image_size, data.image_size, 3), np.uint8, fingerprint=fingerprint or {})
    images, bad = decode(table.paths, data.image_size, data, f"{table.kind} images", writer)
    keep = np.ones(len(table.paths), dtype=bool)
    keep[[b["index"] for b in bad]] = False
    part = SimpleNamespace(kind=table.kind, images=images, attributes=table.attributes[keep], attribute_names=table.attribute_names,
                           families=table.families, captions=[c for c, k in zip(table.captions, keep) if k], split=table.split[keep])
    size = data.image_size
    empty = SimpleNamespace(before=np.zeros((0, size, size, 3), np.uint8), after=np.zeros((0, size, size, 3), np.uint8),
                            before_attributes=np.zeros((0, part.attributes.shape[1]), bool), after_attributes=np.zeros((0, part.attributes.shape[1]), bool),
                            base_index=np.zeros(0, np.int64), family=[], removed=np.zeros(0, np.int64), added=np.zeros(0, np.int64),
                            edit_mask=np.zeros((0, size, size), bool))
    if pair_table is None:
        return part, empty, bad
    before, bad_before = decode(pair_table.before, size, data, "pairs (before)")
    after, bad_after = decode(pair_table.after, size, data, "pairs (after)")
    dropped = {b["index"] for b in bad_before + bad_after} | {i for i, base in enumerate(pair_table.base_index) if not keep[base]}
    use = np.array([i not in dropped for i in range(len(pair_table.base_index))], dtype=bool)
    ok_before = np.ones(len(use), bool)
    ok_before[[b["index"] for b in bad_before]] = False
    ok_after = np.ones(len(use), bool)
    ok_after[[b["index"] for b in bad_after]] = False
    new_row = np.cumsum(keep) - 1  # old table row -> row after dropping bad images
    pairs = SimpleNamespace(
        before=before[use[ok_before]], after=after[use[ok_after]],
        before_attributes=pair_table.before_attributes[use], after_attributes=pair_table.after_attributes[use],
        base_index=new_row[pair_table.base_index[use]], family=[f for f, u in zip(pair_table.family, use) if u],
        removed=pair_table.removed[use], added=pair_table.added[use], edit_mask=np.ones((int(use.sum()), size, size), bool))
    return part, pairs, bad + [{**b, "what": "pair before"} for b in bad_before] + [{**b, "what": "pair after"} for b in bad_after]


def read_source(data: ScenesSettings | FileSettings, seed: int, images_out: Path | None = None, fingerprint: dict[str, Any] | None = None) -> Source:
    """Render the scene world, or load a real dataset, into a `Source`. images_out: a real dataset's images are
    streamed into this row store as they are decoded (`decode`) instead of being held in memory."""
    if isinstance(data, ScenesSettings):
        parts = [render_kind(kind, spec, data, seed) for kind, spec in data.kinds.items()]
        prompts = zero_shot_prompts("objects") if "objects" in data.kinds else {}
        return Source(parts, vocabulary(), prompts, attribute_phrases)
    part, pairs, bad = load_files(data, seed, images_out, fingerprint)
    prompts = {f: [f"a photo of {part.attribute_names[c]}" for c in cols] for f, cols in part.families.items()}
    return Source([(part, pairs)], list(dict.fromkeys([*part.attribute_names, *DISTRACTORS])), prompts, name_phrases, bad)
