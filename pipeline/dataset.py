"""The on-disk dataset a `scenes`/data stage writes and later stages read.

Layout of a dataset directory (images as a uint8 zarr array, so extraction streams them in
chunks; text as JSON, small):

    images.zarr              uint8 (n, H, W, 3)
    attributes.zarr          bool  (n, A)    binary attribute / category labels
    split.zarr               int8  (n,)      0 train, 1 validation, 2 test
    meta.json                kind, attribute_names, families, captions, vocabulary, prompts, provenance
    pairs/before.zarr        uint8 (p, H, W, 3)   intervention pairs (may be empty: p = 0)
    pairs/after.zarr         uint8 (p, H, W, 3)
    pairs/before_attributes.zarr, pairs/after_attributes.zarr   bool (p, A)
    pairs/meta.json          base_index, family, removed, added  (attribute indices, -1 = none)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.store import Store, open_store, write_array

SPLITS = {"train": 0, "val": 1, "test": 2}


@dataclass
class Pairs:
    """Intervention pairs as stored: image stores plus per-pair metadata."""

    before: Store
    after: Store
    before_attributes: np.ndarray  # bool (p, A)
    after_attributes: np.ndarray  # bool (p, A)
    base_index: np.ndarray  # int64 (p,)
    family: list[str]
    removed: np.ndarray  # int64 (p,)
    added: np.ndarray  # int64 (p,), -1 = none

    def __len__(self) -> int:
        return len(self.base_index)


@dataclass
class Dataset:
    """A dataset directory opened for reading (arrays are read lazily)."""

    root: Path
    meta: dict[str, Any]

    @property
    def kind(self) -> str:
        return self.meta["kind"]

    @property
    def attribute_names(self) -> list[str]:
        return self.meta["attribute_names"]

    @property
    def families(self) -> dict[str, list[int]]:
        return self.meta["families"]

    @property
    def captions(self) -> list[str]:
        return self.meta["captions"]

    @property
    def vocabulary(self) -> list[str]:
        return self.meta["vocabulary"]

    @property
    def prompts(self) -> dict[str, list[str]]:
        return self.meta["prompts"]

    @cached_property
    def images(self) -> Store:
        return open_store(self.root / "images.zarr")

    @cached_property
    def attributes(self) -> np.ndarray:
        return open_store(self.root / "attributes.zarr").read().astype(bool)

    @cached_property
    def split(self) -> np.ndarray:
        return open_store(self.root / "split.zarr").read().astype(np.int8)

    def rows(self, split: str) -> np.ndarray:
        """Row indices (int64, ascending) of a split: 'train', 'val' or 'test'."""
        return np.flatnonzero(self.split == SPLITS[split])

    @cached_property
    def pairs(self) -> Pairs:
        meta = json.loads((self.root / "pairs" / "meta.json").read_text())
        return Pairs(
            before=open_store(self.root / "pairs" / "before.zarr"),
            after=open_store(self.root / "pairs" / "after.zarr"),
            before_attributes=open_store(self.root / "pairs" / "before_attributes.zarr").read().astype(bool),
            after_attributes=open_store(self.root / "pairs" / "after_attributes.zarr").read().astype(bool),
            base_index=np.asarray(meta["base_index"], dtype=np.int64),
            family=list(meta["family"]),
            removed=np.asarray(meta["removed"], dtype=np.int64),
            added=np.asarray(meta["added"], dtype=np.int64),
        )


def open_dataset(root: str | Path) -> Dataset:
    """Open a dataset directory; a clear error if it is missing or incomplete."""
    root = Path(root)
    meta_path = root / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{root}: not a dataset directory (no meta.json); run the scenes stage first")
    return Dataset(root, json.loads(meta_path.read_text()))


def write_dataset(root: Path, scenes: Any, pairs: Any, vocabulary: list[str], prompts: dict[str, list[str]], provenance: dict[str, Any]) -> None:
    """Write a `SceneSet` and its `PairSet` (pipeline.data.scenes) into `root` in the layout above."""
    root.mkdir(parents=True, exist_ok=True)
    fp = {"provenance": provenance}
    write_array(root / "images.zarr", scenes.images, fingerprint=fp)
    write_array(root / "attributes.zarr", scenes.attributes.astype(bool), fingerprint=fp)
    write_array(root / "split.zarr", scenes.split.astype(np.int8), fingerprint=fp)
    (root / "pairs").mkdir(exist_ok=True)
    write_array(root / "pairs" / "before.zarr", pairs.before, fingerprint=fp)
    write_array(root / "pairs" / "after.zarr", pairs.after, fingerprint=fp)
    write_array(root / "pairs" / "before_attributes.zarr", pairs.before_attributes.astype(bool), fingerprint=fp)
    write_array(root / "pairs" / "after_attributes.zarr", pairs.after_attributes.astype(bool), fingerprint=fp)
    (root / "pairs" / "meta.json").write_text(json.dumps({
        "base_index": np.asarray(pairs.base_index).tolist(),
        "family": list(pairs.family),
        "removed": np.asarray(pairs.removed).tolist(),
        "added": np.asarray(pairs.added).tolist(),
    }))
    meta = {
        "kind": scenes.kind,
        "n": int(len(scenes.images)),
        "image_size": int(scenes.images.shape[1]),
        "attribute_names": list(scenes.attribute_names),
        "families": {k: [int(i) for i in v] for k, v in scenes.families.items()},
        "captions": list(scenes.captions),
        "vocabulary": list(vocabulary),
        "prompts": prompts,
        "provenance": provenance,
    }
    (root / "meta.json").write_text(json.dumps(meta, indent=1))
