"""MS-COCO instances -> an ImageTable of 80-category multi-hot labels.

Expected under `root` (the official 2017 layout)::

    annotations/instances_<split_name>.json   {"images": [{"id", "file_name", ...}],
                                               "annotations": [{"image_id", "category_id", ...}],
                                               "categories": [{"id", "name", ...}]}
    <split_name>/<file_name>                  the images (or pass images_dir)

A category is present in an image when at least one annotation of it (crowd annotations included) names
the image. Category columns are ordered by category id, which gives the contiguous 0..79 indices that
synCOCO's label lists use (`COCO_CATEGORY_NAMES`). Images are ordered by image id. Images without any
annotation stay in the table with an all-false row (48 of val2017's 5,000).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.data.images import BadImage, check_image_files
from pipeline.data.table import ImageTable, LayoutError, assign_split, check_fractions, join_words, with_article

log = logging.getLogger(__name__)

__all__ = ["load_coco", "coco_caption", "COCO_CATEGORY_NAMES"]

# The 80 COCO object categories in category-id order (ids 1..90 with gaps) = contiguous indices 0..79.
COCO_CATEGORY_NAMES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote", "keyboard",
    "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock", "vase", "scissors",
    "teddy bear", "hair drier", "toothbrush",
)
_SPLIT_PREFIXES = (("train", 0), ("val", 1), ("test", 2))


def coco_caption(names: list[str]) -> str:
    """'a photo of a person, a dog and a frisbee.' from the present categories; 'a photo of a scene.' if none."""
    if not names:
        return "a photo of a scene."
    return f"a photo of {join_words([with_article(name) for name in names])}."


def _entries(data: dict[str, Any], key: str, fields: dict[str, type], path: Path) -> list[tuple[Any, ...]]:
    """The `fields` of every entry of data[key], type-checked; LayoutError naming the entry otherwise."""
    entries = data[key]
    if not isinstance(entries, list):
        raise LayoutError(f"{path}: '{key}' must be a list, got {type(entries).__name__}")
    out = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise LayoutError(f"{path}: {key}[{index}] must be an object, got {type(entry).__name__}")
        values = []
        for field, kind in fields.items():
            value = entry.get(field)
            if not isinstance(value, kind) or isinstance(value, bool):
                shown = f"id {entry['id']!r}, " if "id" in entry and field != "id" else ""
                raise LayoutError(f"{path}: {key}[{index}] ({shown}field '{field}') must be "
                                  f"{'an integer' if kind is int else 'a string'}, got {value!r}")
            values.append(value)
        out.append(tuple(values))
    return out


def _unique_ids(ids: np.ndarray, key: str, path: Path) -> None:
    unique, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise LayoutError(f"{path}: {key} id {int(unique[counts > 1][0])} appears {int(counts[counts > 1][0])} times")


def _positions(known_sorted: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    position = np.clip(np.searchsorted(known_sorted, query), 0, len(known_sorted) - 1)
    return position, known_sorted[position] == query


def load_coco(root: Path | str, split_name: str = "val2017", split: tuple[float, float, float] | None = (0.8, 0.1, 0.1),
              seed: int = 0, images_dir: Path | str | None = None, check: bool = True) -> ImageTable:
    """Load one COCO instances file (see the module docstring) as an ImageTable of kind "coco".

    split: (train, validation, test) fractions of a seeded random split of this file's images; None gives
    every image the split its name implies ("train*" -> 0, "val*" -> 1, "test*" -> 2), for users who load
    train2017 and val2017 separately. images_dir: the image folder, default root/<split_name>.
    check: open every image's header first (5,000 files for val2017, under a second).
    Returns attributes bool (n, 80) multi-hot, attribute_names the category names, families {"object": all},
    captions listing the present categories, labels/class_names None (COCO has no single class per image).
    Raises LayoutError (missing file, invalid JSON, missing keys or fields, duplicate ids, an annotation
    naming an unknown image or category) or BadImage (an image missing or unreadable).
    """
    root = Path(root)
    if not isinstance(split_name, str) or not split_name or "/" in split_name:
        raise ValueError(f"split_name: expected a name like 'val2017', got {split_name!r}")
    fixed_code: int | None = None
    fractions: tuple[float, float, float] | None = None
    if split is None:
        fixed_code = next((c for prefix, c in _SPLIT_PREFIXES if split_name.startswith(prefix)), None)
        if fixed_code is None:
            raise ValueError(f"split: None needs a split_name starting with train, val or test, got {split_name!r}")
    else:
        fractions = check_fractions(split)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    path = root / "annotations" / f"instances_{split_name}.json"
    if not path.is_file():
        raise LayoutError(f"COCO: missing file {path} (expected the official annotations/instances_<split>.json)")
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise LayoutError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise LayoutError(f"{path}: expected a JSON object with keys images, annotations, categories")
    missing = [key for key in ("images", "annotations", "categories") if key not in data]
    if missing:
        raise LayoutError(f"{path}: missing keys {missing} (expected images, annotations, categories)")

    categories = sorted(_entries(data, "categories", {"id": int, "name": str}, path))
    category_ids = np.array([c[0] for c in categories], dtype=np.int64)
    _unique_ids(category_ids, "category", path)
    if not len(categories):
        raise LayoutError(f"{path}: 'categories' is empty")
    if len(categories) != len(COCO_CATEGORY_NAMES):
        log.warning("COCO: %s has %d categories; the release has %d", path, len(categories), len(COCO_CATEGORY_NAMES))
    images = sorted(_entries(data, "images", {"id": int, "file_name": str}, path))
    if not images:
        raise LayoutError(f"{path}: 'images' is empty")
    image_ids = np.array([i[0] for i in images], dtype=np.int64)
    _unique_ids(image_ids, "image", path)
    annotations = _entries(data, "annotations", {"image_id": int, "category_id": int}, path)
    pairs = np.array(annotations, dtype=np.int64).reshape(-1, 2)

    rows, found = _positions(image_ids, pairs[:, 0])
    if not found.all():
        k = int(np.flatnonzero(~found)[0])
        raise LayoutError(f"{path}: annotations[{k}]: image_id {int(pairs[k, 0])} not found in 'images'")
    columns, found = _positions(category_ids, pairs[:, 1])
    if not found.all():
        k = int(np.flatnonzero(~found)[0])
        raise LayoutError(f"{path}: annotations[{k}]: category_id {int(pairs[k, 1])} not found in 'categories'")

    folder = Path(images_dir) if images_dir is not None else root / split_name
    if not folder.is_dir():
        raise LayoutError(f"COCO: image folder {folder} is not a directory (expected root/{split_name}/ or images_dir)")
    paths = [folder / file_name for _, file_name in images]
    if check:
        check_image_files(paths, f"listed in {path.name}")
    else:
        absent = next((p for p in paths if not p.is_file()), None)
        if absent is not None:
            raise BadImage(absent, f"file not found (listed in {path.name})")

    n = len(images)
    attributes = np.zeros((n, len(categories)), dtype=bool)
    attributes[rows, columns] = True
    names = [c[1] for c in categories]
    captions = [coco_caption([names[c] for c in np.flatnonzero(row)]) for row in attributes]
    if fractions is None:
        split_codes = np.full(n, fixed_code, dtype=np.int8)
    else:
        split_codes = assign_split(np.zeros(n, dtype=np.int64), fractions, int(seed))
    log.info("COCO: %d images, %d annotations, %d categories from %s", n, len(pairs), len(categories), path)
    return ImageTable("coco", paths, attributes, names, {"object": list(range(len(categories)))}, captions,
                      split_codes, None, None)
