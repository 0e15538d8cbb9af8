"""The on-disk dataset a `scenes`/data stage writes and later stages read.

One dataset may hold several *kinds* of scene (e.g. CUB-like `objects` and COCO-like `multi`):
their rows are stacked, their label columns side by side (an object attribute is simply false on
a multi-object scene's row), and `source` says which kind each row is. Models train on all rows;
concept metrics are computed per kind, on that kind's rows and columns only.

Layout of a dataset directory (everything per row is a zarr row store, so later stages read the rows they need
and never a whole column of a million-image dataset; text that does not grow with the rows is JSON):

    images.zarr              uint8 (n, H, W, 3)   (absent when the source has no images: `has_images`)
    attributes.zarr          bool  (n, A)    binary attribute / category labels (`labels(rows)` reads rows)
    split.zarr               int8  (n,)      0 train, 1 validation, 2 test
    source.zarr              int8  (n,)      index into meta["kinds"]
    captions.zarr            uint8 (n, W)    each row's caption, UTF-8, zero-padded (`caption_rows(rows)`)
    meta.json                kinds (name -> columns, families), attribute_names, phrases (per attribute, the
                             phrases that state it in a caption), vocabulary, prompts, provenance; `images`
                             (false for a source without images), `embeddings` (true when the source wrote its
                             own embeddings into embeddings/, the synthetic source)
    pairs/before.zarr        uint8 (p, H, W, 3)   intervention pairs of every kind (may be empty: p = 0; absent
    pairs/after.zarr         uint8 (p, H, W, 3)   without images)
    pairs/before_attributes.zarr, pairs/after_attributes.zarr   bool (p, A)
    pairs/meta.json          kind, base_index (row in this dataset), family, removed, added
                             (attribute columns of this dataset, -1 = none)
    embeddings/              (synthetic source only) images.zarr, pairs_before.zarr, pairs_after.zarr, concepts.zarr:
                             the stores the extract stage would write, which it links into store/embeddings
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.store import Store, open_store, write_array

SPLITS = {"train": 0, "val": 1, "test": 2}
#: the images store inside a dataset directory (a real source streams its decoded images there)
IMAGES = "images.zarr"


@dataclass
class Pairs:
    """Intervention pairs as stored: image stores plus per-pair metadata."""

    before: Store | None  # None when the dataset has no images
    after: Store | None
    before_attributes: np.ndarray  # bool (p, A)
    after_attributes: np.ndarray  # bool (p, A)
    base_index: np.ndarray  # int64 (p,) row of the base image in the dataset
    family: list[str]
    removed: np.ndarray  # int64 (p,)
    added: np.ndarray  # int64 (p,), -1 = none
    kind: list[str]

    def __len__(self) -> int:
        return len(self.base_index)

    def of_kind(self, kind: str) -> np.ndarray:
        """Indices (int64) of the pairs of one kind."""
        return np.flatnonzero(np.asarray(self.kind) == kind)


@dataclass
class Dataset:
    """A dataset directory opened for reading (arrays are read lazily)."""

    root: Path
    meta: dict[str, Any]

    @property
    def kinds(self) -> list[str]:
        """Kinds of scene in this dataset, in row-block order."""
        return list(self.meta["kinds"])

    def columns(self, kind: str) -> list[int]:
        """The attribute columns that label rows of `kind`."""
        return self.meta["kinds"][kind]["columns"]

    def families(self, kind: str) -> dict[str, list[int]]:
        """Attribute families of `kind` (dataset column indices)."""
        return self.meta["kinds"][kind]["families"]

    def one_hot(self, kind: str) -> bool:
        """Whether every family of `kind` is one-hot (one value per image): objects yes, multi-label no."""
        return bool(self.meta["kinds"][kind]["one_hot"])

    @property
    def attribute_names(self) -> list[str]:
        return self.meta["attribute_names"]

    @property
    def phrases(self) -> list[list[str]]:
        """Per attribute column, the phrases that state it in a caption (`pipeline.data.phrases`)."""
        return self.meta["phrases"]

    @property
    def n(self) -> int:
        """Rows (images) in the dataset."""
        return int(self.meta["n"])

    @property
    def has_images(self) -> bool:
        """Whether images.zarr exists (a synthetic source writes embeddings and labels only)."""
        return bool(self.meta.get("images", True))

    @property
    def has_embeddings(self) -> bool:
        """Whether the source wrote its own embeddings (embeddings/, the synthetic source) for extract to link."""
        return bool(self.meta.get("embeddings", False))

    @cached_property
    def captions(self) -> list[str]:
        """Every row's caption (all rows in memory: prefer `caption_rows` on large datasets)."""
        return decode_texts(open_store(self.root / "captions.zarr").read())

    def caption_rows(self, rows: np.ndarray) -> list[str]:
        """The captions of dataset rows `rows` (int, any order), reading only those rows."""
        return decode_texts(open_store(self.root / "captions.zarr").take(np.asarray(rows, dtype=np.int64)))

    def labels(self, rows: np.ndarray) -> np.ndarray:
        """bool (len(rows), A): the attribute labels of dataset rows `rows` (int, any order), reading only those rows."""
        return open_store(self.root / "attributes.zarr").take(np.asarray(rows, dtype=np.int64)).astype(bool)

    @property
    def vocabulary(self) -> list[str]:
        return self.meta["vocabulary"]

    @property
    def prompts(self) -> dict[str, list[str]]:
        return self.meta["prompts"]

    @cached_property
    def images(self) -> Store:
        return open_store(self.root / IMAGES)

    @cached_property
    def attributes(self) -> np.ndarray:
        """Every row's labels bool (n, A) in memory (prefer `labels(rows)` on large datasets)."""
        return open_store(self.root / "attributes.zarr").read().astype(bool)

    @cached_property
    def split(self) -> np.ndarray:
        return open_store(self.root / "split.zarr").read().astype(np.int8)

    @cached_property
    def source(self) -> np.ndarray:
        return open_store(self.root / "source.zarr").read().astype(np.int8)

    def rows(self, split: str, kind: str | None = None) -> np.ndarray:
        """Row indices (int64, ascending) of a split ('train', 'val', 'test'), optionally of one kind."""
        selected = self.split == SPLITS[split]
        if kind is not None:
            selected &= self.source == self.kinds.index(kind)
        return np.flatnonzero(selected)

    @cached_property
    def pairs(self) -> Pairs:
        meta = json.loads((self.root / "pairs" / "meta.json").read_text())
        return Pairs(
            before=open_store(self.root / "pairs" / "before.zarr") if self.has_images else None,
            after=open_store(self.root / "pairs" / "after.zarr") if self.has_images else None,
            before_attributes=open_store(self.root / "pairs" / "before_attributes.zarr").read().astype(bool),
            after_attributes=open_store(self.root / "pairs" / "after_attributes.zarr").read().astype(bool),
            base_index=np.asarray(meta["base_index"], dtype=np.int64),
            family=list(meta["family"]),
            removed=np.asarray(meta["removed"], dtype=np.int64),
            added=np.asarray(meta["added"], dtype=np.int64),
            kind=list(meta["kind"]),
        )


def encode_texts(texts: list[str]) -> np.ndarray:
    """uint8 (n, W): each text's UTF-8 bytes, zero-padded to the longest (W >= 1), for a row store."""
    raw = [t.encode("utf-8") for t in texts]
    width = max([len(b) for b in raw] + [1])
    out = np.zeros((len(raw), width), dtype=np.uint8)
    for i, b in enumerate(raw):  # once per dataset, at write time
        out[i, : len(b)] = np.frombuffer(b, dtype=np.uint8)
    return out


def decode_texts(rows: np.ndarray) -> list[str]:
    """The texts of `encode_texts` rows (uint8 (n, W)) back, trailing zero bytes dropped."""
    width = rows.shape[1] if rows.ndim == 2 else 0
    return [bytes(r).rstrip(b"\0").decode("utf-8") for r in np.asarray(rows, dtype=np.uint8).reshape(-1, width)]


def sample_rows(rows: np.ndarray, n: int, seed: int) -> np.ndarray:
    """A seeded subset of at most n of `rows`, sorted (so stores read it chunk by chunk). The same
    (rows, n, seed) always gives the same subset: the train stage and the untrained twin in the
    evaluate stage initialise from identical samples this way."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(rows, size=min(n, len(rows)), replace=False))


def open_dataset(root: str | Path) -> Dataset:
    """Open a dataset directory; a clear error if it is missing or incomplete."""
    root = Path(root)
    meta_path = root / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{root}: not a dataset directory (no meta.json); run the scenes stage first")
    return Dataset(root, json.loads(meta_path.read_text()))


def open_embeddings(data: Dataset, path: str | Path) -> Store:
    """The image embeddings store at `path` (n, d), checked to hold one row per image of `data`: a different count
    means extract ran on another dataset or did not finish."""
    store = open_store(path)
    if len(store) != data.n:
        raise ValueError(f"{store.path}: {len(store)} rows, but the dataset has {data.n} images; rerun extract")
    return store


def write_dataset(root: Path, parts: list[tuple[Any, Any]], vocabulary: list[str], prompts: dict[str, list[str]],
                  phrases: Callable[[list[str]], list[list[str]]], provenance: dict[str, Any]) -> None:
    """Write (SceneSet, PairSet) parts (pipeline.data.world.scenes, or a real dataset's tables), one per kind,
    stacked into `root`. A single part whose `images` is already the store root/images.zarr (a real source streams
    its decoded images there, `pipeline.data.sources.decode`) keeps it.

    Row blocks follow `parts` order; label columns are the parts' columns side by side, so each
    part's attribute, family and pair indices are shifted by the columns before it. phrases: the source's rule
    for the phrases that state each attribute in a caption (`pipeline.data.phrases`), applied to every name.
    """
    if not parts:
        raise ValueError("write_dataset: no scene sets given")
    root.mkdir(parents=True, exist_ok=True)
    fp = {"provenance": provenance}
    n_total = sum(len(s.images) for s, _ in parts)
    a_total = sum(s.attributes.shape[1] for s, _ in parts)
    attributes = np.zeros((n_total, a_total), dtype=bool)
    before_attr = np.zeros((sum(len(p.base_index) for _, p in parts), a_total), dtype=bool)
    after_attr = np.zeros_like(before_attr)
    kinds: dict[str, Any] = {}
    names: list[str] = []
    pair_meta: dict[str, list[Any]] = {"kind": [], "base_index": [], "family": [], "removed": [], "added": []}
    row = col = pair = 0
    for scenes, pairs in parts:
        n, a, p = len(scenes.images), scenes.attributes.shape[1], len(pairs.base_index)
        attributes[row : row + n, col : col + a] = scenes.attributes
        before_attr[pair : pair + p, col : col + a] = pairs.before_attributes
        after_attr[pair : pair + p, col : col + a] = pairs.after_attributes
        one_hot = bool(scenes.attributes.size) and all((scenes.attributes[:, c].sum(axis=1) == 1).all() for c in scenes.families.values())
        kinds[scenes.kind] = {
            "columns": list(range(col, col + a)),
            "families": {f: [int(c) + col for c in cols] for f, cols in scenes.families.items()},
            "one_hot": one_hot,
            "n": n,
        }
        names.extend(scenes.attribute_names)
        pair_meta["kind"] += [scenes.kind] * p
        pair_meta["base_index"] += (np.asarray(pairs.base_index) + row).tolist()
        pair_meta["family"] += list(pairs.family)
        pair_meta["removed"] += [int(x) + col if x >= 0 else -1 for x in np.asarray(pairs.removed)]
        pair_meta["added"] += [int(x) + col if x >= 0 else -1 for x in np.asarray(pairs.added)]
        row, col, pair = row + n, col + a, pair + p
    images = [s.images for s, _ in parts]
    if not (len(images) == 1 and isinstance(images[0], Store) and images[0].path == root / IMAGES):  # else streamed there
        write_array(root / IMAGES, np.concatenate(images), fingerprint=fp)
    write_array(root / "attributes.zarr", attributes, fingerprint=fp)
    write_array(root / "split.zarr", np.concatenate([s.split for s, _ in parts]).astype(np.int8), fingerprint=fp)
    write_array(root / "source.zarr", np.concatenate([np.full(len(s.images), i, np.int8) for i, (s, _) in enumerate(parts)]), fingerprint=fp)
    write_array(root / "captions.zarr", encode_texts([c for s, _ in parts for c in s.captions]), fingerprint=fp)
    (root / "pairs").mkdir(exist_ok=True)
    write_array(root / "pairs" / "before.zarr", np.concatenate([p.before for _, p in parts]), fingerprint=fp)
    write_array(root / "pairs" / "after.zarr", np.concatenate([p.after for _, p in parts]), fingerprint=fp)
    write_array(root / "pairs" / "before_attributes.zarr", before_attr, fingerprint=fp)
    write_array(root / "pairs" / "after_attributes.zarr", after_attr, fingerprint=fp)
    write_array(root / "pairs" / "edit_mask.zarr", np.concatenate([p.edit_mask for _, p in parts]).astype(bool), fingerprint=fp)
    (root / "pairs" / "meta.json").write_text(json.dumps(pair_meta))
    meta = {
        "kinds": kinds,
        "n": int(n_total),
        "image_size": int(parts[0][0].images.shape[1]),
        "attribute_names": names,
        "phrases": phrases(names),
        "vocabulary": list(vocabulary),
        "prompts": prompts,
        "provenance": provenance,
    }
    (root / "meta.json").write_text(json.dumps(meta, indent=1))


def edit_text(attribute_names: list[str], removed: int, added: int) -> str:
    """An intervention pair's edit in words: "red body → blue body", or "tree removed" (added = -1)."""
    if not 0 <= removed < len(attribute_names) or not -1 <= added < len(attribute_names):
        raise ValueError(f"removed/added: expected attribute columns in 0..{len(attribute_names) - 1} (added may be -1), got {removed}, {added}")
    return f"{attribute_names[removed]} → {attribute_names[added]}" if added >= 0 else f"{attribute_names[removed]} removed"
