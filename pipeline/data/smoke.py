"""The 64-image stand-ins of the real datasets, for the smoke variants of the real-model presets (offline).

Each writes a folder in the exact layout its loader reads, with images rendered by the procedural world
(`pipeline.data.world`), so that `cedar preset <name>-smoke` runs every stage of the real preset (the real loader,
the real encoder architecture with random weights) without a network:

- `write_folders`: ImageNet-style class folders (`pipeline.data.folders`): 64 object scenes in 4 classes (their
  shape), 16 images each;
- `write_syncub`: a synCUB copy (`pipeline.data.syn_benchmarks`): metadata.csv, attributes.txt in the CUB format
  ("<id> has_<family>::<value>", the scene world's object families) and 32 pairs of object scenes (the base image
  and the same scene with one attribute changed): 64 images;
- `write_syncoco`: a synCOCO copy: 32 pairs of multi-object scenes with one object removed, their 12 categories
  standing in for the first 12 COCO categories: 64 images.

The numbers these give mean nothing (random weights, 64 images); they prove the path runs end to end.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from PIL import Image

from pipeline.data.coco import COCO_CATEGORY_NAMES
from pipeline.data.world import scenes as world

#: images each smoke dataset holds
N_IMAGES = 64


def _save(image: np.ndarray, path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).save(path)
    return path.name


def _token(name: str) -> str:
    return name.strip().replace(" ", "_")


def write_folders(root: Path, image_size: int = 64, seed: int = 0) -> Path:
    """root/<class>/<i>.png: 64 object scenes in the 4 most frequent values of their shape family."""
    scenes = world.generate_objects(4 * N_IMAGES, image_size=image_size, seed=seed)
    family = next(name for name in scenes.families if "shape" in name)
    columns = scenes.families[family]
    value = np.argmax(scenes.attributes[:, columns], axis=1)
    classes = np.argsort(-np.bincount(value, minlength=len(columns)), kind="stable")[:4]
    for c in classes:
        rows = np.flatnonzero(value == c)[: N_IMAGES // 4]
        if len(rows) < N_IMAGES // 4:
            raise ValueError(f"smoke folders: only {len(rows)} scenes of class {scenes.attribute_names[columns[c]]!r}")
        for i, row in enumerate(rows):
            _save(scenes.images[row], root / _token(scenes.attribute_names[columns[c]]) / f"{i:03d}.png")
    return root


def _pairs(kind: str, image_size: int, seed: int) -> tuple[world.SceneSet, world.PairSet]:
    n = N_IMAGES // 2
    if kind == "objects":
        scenes = world.generate_objects(2 * n, image_size=image_size, seed=seed, split=(0.25, 0.25, 0.5))
        return scenes, world.object_pairs(scenes, n, seed=seed + 1)
    scenes = world.generate_multi(2 * n, image_size=image_size, seed=seed, split=(0.25, 0.25, 0.5), max_objects=4)
    return scenes, world.multi_pairs(scenes, n, seed=seed + 1)


def _index_list(row: np.ndarray) -> str:
    return "[" + ", ".join(str(int(i)) for i in np.flatnonzero(row)) + "]"


def write_syncub(root: Path, image_size: int = 64, seed: int = 0) -> Path:
    """A synCUB copy: 32 attribute-edit pairs of object scenes (64 images), metadata.csv and attributes.txt."""
    scenes, pairs = _pairs("objects", image_size, seed)
    family_of = {c: family for family, cols in scenes.families.items() for c in cols}
    names = [f"has_{_token(family_of[c])}::{_token(scenes.attribute_names[c])}" for c in range(len(scenes.attribute_names))]
    root.mkdir(parents=True, exist_ok=True)
    (root / "attributes.txt").write_text("".join(f"{i + 1} {name}\n" for i, name in enumerate(names)))
    with open(root / "metadata.csv", "w", newline="", encoding="utf-8") as handle:
        out = csv.writer(handle)
        out.writerow(["pair_id", "orig_image", "syn_image", "class_id", "class_name", "old_attr", "new_attr", "old_attr_idx",
                      "new_attr_idx", "orig_attr_idx", "syn_attr_idx"])
        for j in range(len(pairs.base_index)):
            orig = _save(pairs.before[j], root / "images" / f"{j:06d}_orig.png")
            syn = _save(pairs.after[j], root / "images" / f"{j:06d}_syn.png")
            removed, added = int(pairs.removed[j]), int(pairs.added[j])
            out.writerow([j, f"images/{orig}", f"images/{syn}", 1, "Smoke_bird", names[removed], names[added], removed, added,
                          _index_list(pairs.before_attributes[j]), _index_list(pairs.after_attributes[j])])
    return root


def write_syncoco(root: Path, image_size: int = 64, seed: int = 0) -> Path:
    """A synCOCO copy: 32 object-removal pairs of multi-object scenes (64 images); scene category i stands for COCO
    category i."""
    scenes, pairs = _pairs("multi", image_size, seed)
    if len(scenes.attribute_names) > len(COCO_CATEGORY_NAMES):
        raise ValueError(f"smoke syncoco: {len(scenes.attribute_names)} scene categories > {len(COCO_CATEGORY_NAMES)} COCO categories")
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "metadata.csv", "w", newline="", encoding="utf-8") as handle:
        out = csv.writer(handle)
        out.writerow(["pair_id", "orig_image", "syn_image", "coco_idx", "removed_cls_idx", "removed_class", "orig_labels", "syn_labels"])
        for j in range(len(pairs.base_index)):
            orig = _save(pairs.before[j], root / "images" / f"{j:06d}_orig.png")
            syn = _save(pairs.after[j], root / "images" / f"{j:06d}_syn.png")
            removed = int(pairs.removed[j])
            out.writerow([j, f"images/{orig}", f"images/{syn}", int(pairs.base_index[j]), removed, COCO_CATEGORY_NAMES[removed],
                          _index_list(pairs.before_attributes[j]), _index_list(pairs.after_attributes[j])])
    return root


#: what each smoke dataset's writer is
WRITERS = {"folders": write_folders, "syncub": write_syncub, "syncoco": write_syncoco}
