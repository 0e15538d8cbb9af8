"""The data sources' options (params.yaml `data:`): the procedural scenes, a real dataset on disk, planted synthetic
embeddings. Light (no torch, no zarr, no image decoding), so that params.yaml's schema loads without the loaders."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import AfterValidator, Field, Strict, model_validator

from pipeline.data.table import IMAGE_EXTENSIONS, assign_split
from pipeline.settings import Float, NonNegativeFloat, NonNegativeInt, settings


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

    def split_counts(self, seed: int) -> dict[str, tuple[int, int, int]]:
        """Images per (train, validation, test) split of each kind, exactly as the world splits them (`assign_split`
        of each kind's images with the seed), before anything is rendered."""
        return {kind: tuple(int(c) for c in np.bincount(assign_split(np.zeros(spec.n_images), tuple(self.split), seed), minlength=3))
                for kind, spec in self.kinds.items()}

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
