"""The schema of real (file-based) image datasets, and the helpers every loader shares.

`ImageTable` carries the same information as `scenes.SceneSet`, except that images stay files on disk
(real datasets do not fit in memory at a common size, and the extraction stage resizes them anyway);
`PairTable` mirrors `scenes.PairSet` for intervention pairs (synCUB / synCOCO). The loaders that fill
them live beside this module: `folders`, `cub`, `coco`, `syn`.

Errors: a malformed dataset raises `LayoutError` (a `ValueError`) naming the file, the line where there
is one, and what was expected; an image file that is missing or cannot be decoded raises
`pipeline.data.images.BadImage` (also a `ValueError`) naming the file and the reason. Loaders check the whole layout before returning,
so a bad dataset fails at load time, not hours into an extraction.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

__all__ = [
    "ImageTable", "PairTable", "LayoutError", "IMAGE_EXTENSIONS", "SPLIT_NAMES", "assign_split", "check_fractions", "read_fields",
    "parse_int", "with_article", "join_words",
]

# lower-case suffixes of the image files the loaders pick up (anything PIL decodes; case-insensitive)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
SPLIT_NAMES = ("train", "validation", "test")


class LayoutError(ValueError):
    """A dataset on disk does not have the expected layout (missing file, bad line, unknown id, ...)."""


@dataclass
class ImageTable:
    """A labelled set of image files.

    kind: "folders" | "cub" | "coco" | "syncub" | "syncoco". paths: n image files.
    attributes: bool (n, A): binary attributes (CUB), categories (COCO) or one-hot classes (folders).
    attribute_names: A natural phrases usable as text prompts ("curved bill shape", "dog").
    families: family -> attribute columns (CUB: "has_bill_shape" ...; folders: {"class": all};
    COCO: {"object": all}). captions: n captions generated from the labels.
    split: int8 (n,) 0 train, 1 validation, 2 test.
    labels: int64 (n,) class index into class_names where the dataset has classes (folders, CUB), else
    None (then class_names is None too).
    """

    kind: str
    paths: list[Path]
    attributes: np.ndarray
    attribute_names: list[str]
    families: dict[str, list[int]]
    captions: list[str]
    split: np.ndarray
    labels: np.ndarray | None
    class_names: list[str] | None

    def __post_init__(self) -> None:
        n = len(self.paths)
        if self.attributes.dtype != bool or self.attributes.ndim != 2 or self.attributes.shape[0] != n:
            raise ValueError(f"ImageTable.attributes: expected bool (n={n}, A), got {self.attributes.dtype} {self.attributes.shape}")
        a = self.attributes.shape[1]
        if len(self.attribute_names) != a:
            raise ValueError(f"ImageTable.attribute_names: expected {a} names (one per attribute column), got {len(self.attribute_names)}")
        for family, columns in self.families.items():
            if any(not 0 <= c < a for c in columns):
                raise ValueError(f"ImageTable.families[{family!r}]: columns must lie in [0, {a}), got {columns}")
        if len(self.captions) != n:
            raise ValueError(f"ImageTable.captions: expected {n} captions, got {len(self.captions)}")
        if self.split.dtype != np.int8 or self.split.shape != (n,) or not np.isin(self.split, (0, 1, 2)).all():
            raise ValueError(f"ImageTable.split: expected int8 ({n},) with values 0, 1, 2, got {self.split.dtype} {self.split.shape}")
        if (self.labels is None) != (self.class_names is None):
            raise ValueError("ImageTable.labels and class_names: give both or neither")
        if self.labels is not None and self.class_names is not None:
            if self.labels.dtype != np.int64 or self.labels.shape != (n,):
                raise ValueError(f"ImageTable.labels: expected int64 ({n},), got {self.labels.dtype} {self.labels.shape}")
            if n and not (0 <= self.labels.min() and self.labels.max() < len(self.class_names)):
                raise ValueError(f"ImageTable.labels: expected class indices in [0, {len(self.class_names)})")

    def __len__(self) -> int:
        return len(self.paths)


@dataclass
class PairTable:
    """Intervention pairs of image files: `after` is `before` with one attribute edited (or one object removed).

    before, after: p image files. before_attributes, after_attributes: bool (p, A) labels of each side (as
    published; they differ at least in `removed` and, unless it is -1, `added`). base_index: int64 (p,) row of
    the `before` image in the accompanying ImageTable. family: edited family per pair ("object" for removals).
    removed: int64 (p,) attribute column switched off. added: int64 (p,) column switched on, -1 = none.
    Unlike `scenes.PairSet` there is no `edit_mask`: the edits come from an image-editing model, so the
    changed pixels are not known.
    """

    before: list[Path]
    after: list[Path]
    before_attributes: np.ndarray
    after_attributes: np.ndarray
    base_index: np.ndarray
    family: list[str]
    removed: np.ndarray
    added: np.ndarray

    def __post_init__(self) -> None:
        p = len(self.before)
        if len(self.after) != p or len(self.family) != p:
            raise ValueError(f"PairTable: before, after and family must all have p = {p} entries")
        for name in ("before_attributes", "after_attributes"):
            value = getattr(self, name)
            if value.dtype != bool or value.ndim != 2 or value.shape[0] != p:
                raise ValueError(f"PairTable.{name}: expected bool (p={p}, A), got {value.dtype} {value.shape}")
        a = self.before_attributes.shape[1]
        if self.after_attributes.shape[1] != a:
            raise ValueError(f"PairTable: before_attributes and after_attributes must have the same A, got {a} and {self.after_attributes.shape[1]}")
        for name in ("base_index", "removed", "added"):
            value = getattr(self, name)
            if value.dtype != np.int64 or value.shape != (p,):
                raise ValueError(f"PairTable.{name}: expected int64 ({p},), got {value.dtype} {value.shape}")
        if p and not (self.removed.min() >= 0 and self.removed.max() < a and self.added.min() >= -1 and self.added.max() < a):
            raise ValueError(f"PairTable: removed must lie in [0, {a}) and added in [-1, {a})")

    def __len__(self) -> int:
        return len(self.before)


# ---------------------------------------------------------------------------------------------------------
# splits


def check_fractions(split: Any, name: str = "split") -> tuple[float, float, float]:
    """Validate (train, validation, test) fractions: three finite non-negative numbers summing to 1."""
    try:
        fractions = tuple(float(f) for f in split)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected three fractions (train, validation, test), got {split!r}") from None
    if len(fractions) != 3 or not all(math.isfinite(f) and f >= 0 for f in fractions):
        raise ValueError(f"{name}: expected three non-negative finite fractions (train, validation, test), got {split!r}")
    if abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(f"{name}: fractions must sum to 1, got {split!r} (sum {sum(fractions):.6g})")
    return fractions  # type: ignore[return-value]


def assign_split(groups: np.ndarray, fractions: tuple[float, float, float], seed: int) -> np.ndarray:
    """int8 (n,) split codes (0 train, 1 validation, 2 test), stratified by `groups` (int (n,), e.g. class labels).

    Within each group the rows are put in a random order (seeded) and cut at round(m * f0) and
    round(m * (f0 + f1)), m = the group's size: counts per group are within one of m * f and sum to m, and
    every split sees every class in proportion. Pass equal groups for a plain random split. Deterministic
    in (groups, fractions, seed); the row order of the input matters, so loaders sort their files first.
    """
    groups = np.asarray(groups)
    n = len(groups)
    codes = np.full(n, 2, dtype=np.int8)
    if n == 0:
        return codes
    _, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    order = np.random.default_rng([seed, 0x5EED]).permutation(n)
    order = order[np.argsort(inverse[order], kind="stable")]  # grouped, random within each group
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.arange(n) - starts[inverse[order]]
    cut1 = np.rint(counts * fractions[0]).astype(np.int64)
    cut2 = np.maximum(cut1, np.minimum(counts, np.rint(counts * (fractions[0] + fractions[1])).astype(np.int64)))
    member_cut1, member_cut2 = cut1[inverse[order]], cut2[inverse[order]]
    codes[order] = np.where(rank < member_cut1, 0, np.where(rank < member_cut2, 1, 2)).astype(np.int8)
    return codes


# ---------------------------------------------------------------------------------------------------------
# text files


def read_fields(path: Path, columns: Sequence[str], dataset: str) -> list[tuple[int, list[str]]]:
    """Read a whitespace-separated text file as (line number, fields) per non-blank line.

    columns: the expected field names; a line with fewer fields raises LayoutError naming the file, line and
    the expected columns; the last field takes the rest of the line (so paths may contain spaces).
    """
    if not path.is_file():
        raise LayoutError(f"{dataset}: missing file {path} (expected lines '{' '.join(columns)}')")
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            fields = line.split(maxsplit=len(columns) - 1)
            if len(fields) < len(columns):
                raise LayoutError(f"{path}:{number}: expected {len(columns)} fields '{' '.join(columns)}', "
                                  f"got {len(fields)}: {line.strip()!r}")
            fields[-1] = fields[-1].rstrip()
            rows.append((number, fields))
    if not rows:
        raise LayoutError(f"{path}: file is empty (expected lines '{' '.join(columns)}')")
    return rows


def parse_int(text: str, where: str, column: str) -> int:
    """int(text), or LayoutError naming `where` (file:line) and the column."""
    try:
        return int(text)
    except ValueError:
        raise LayoutError(f"{where}: {column} must be an integer, got {text!r}") from None


# ---------------------------------------------------------------------------------------------------------
# captions


def with_article(noun: str) -> str:
    """'a bird', 'an owl' (a vowel letter decides; good enough for class and category names)."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def join_words(words: Sequence[str]) -> str:
    """'x', 'x and y', 'x, y and z'."""
    if len(words) <= 1:
        return "".join(words)
    return f"{', '.join(words[:-1])} and {words[-1]}"
