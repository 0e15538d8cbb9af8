"""CUB-200-2011 (Caltech-UCSD Birds) from its released layout -> an ImageTable of 312 binary part attributes.

Expected under `root` (the `CUB_200_2011/` folder of the official archive)::

    images.txt                           "<image_id> <path under images/>"
    image_class_labels.txt               "<image_id> <class_id>"
    train_test_split.txt                 "<image_id> <is_training_image 0|1>"
    classes.txt                          "<class_id> <NNN.Class_name>"
    attributes/image_attribute_labels.txt "<image_id> <attribute_id> <is_present> <certainty_id> <time>"
    attributes/attributes.txt            "<attribute_id> <has_family::value>"  (312 lines)
    images/<path>

The archive ships `attributes.txt` one level up (beside `CUB_200_2011/`), so it is also looked for at
`root/attributes.txt` and `root/../attributes.txt`. A few lines of the released
`image_attribute_labels.txt` carry more than five fields; only the first three are used, so extra fields
are accepted, but a line with fewer than five fields is an error. `is_present` is taken as published;
`certainty_id` (1 = not visible ... 4 = definitely) is not used.

Attributes: bool (n, A) from is_present; names turned into phrases ("has_bill_shape::curved_(up_or_down)"
-> "curved (up or down) bill shape"); families keyed by the name prefix ("has_bill_shape"). Classes: the
200 species, labels = rank of the class id. Split: the official test images -> 2; the official training
images -> 0, except `val_fraction` of them (stratified by class, seeded) -> 1.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.data.images import BadImage, check_image_files
from pipeline.data.table import ImageTable, LayoutError, assign_split, join_words, parse_int, read_fields, with_article

log = logging.getLogger(__name__)

__all__ = [
    "load_cub", "find_attribute_list", "read_attribute_list", "attribute_phrase", "attribute_families",
    "class_phrase", "bird_caption", "CAPTION_FAMILIES",
]

# families whose (first) present value goes into a bird's caption, in this order
CAPTION_FAMILIES = ("has_primary_color", "has_bill_shape", "has_size")
_LABEL_COLUMNS = ["image_id", "attribute_id", "is_present", "certainty_id", "time"]


# ---------------------------------------------------------------------------------------------------------
# names


def find_attribute_list(root: Path) -> Path:
    """The attribute list: root/attributes/attributes.txt, else root/attributes.txt, else root/../attributes.txt."""
    candidates = [root / "attributes" / "attributes.txt", root / "attributes.txt", root.parent / "attributes.txt"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise LayoutError(f"CUB: missing file {candidates[0]} (also looked for {candidates[1]} and {candidates[2]}; "
                      "expected 312 lines '<attribute_id> <has_family::value>')")


def read_attribute_list(path: Path) -> list[str]:
    """Raw attribute names ("has_bill_shape::dagger") in id order; ids must be 1..A, each once, in order."""
    rows = read_fields(path, ["attribute_id", "attribute_name"], "CUB")
    names = []
    for expected, (number, (id_text, name)) in enumerate(rows, start=1):
        attribute_id = parse_int(id_text, f"{path}:{number}", "attribute_id")
        if attribute_id != expected:
            raise LayoutError(f"{path}:{number}: expected attribute_id {expected} (ids 1..A in order), got {attribute_id}")
        family, sep, value = name.partition("::")
        if not sep or not family or not value:
            raise LayoutError(f"{path}:{number}: expected an attribute name 'has_family::value', got {name!r}")
        names.append(name)
    return names


def attribute_phrase(name: str) -> str:
    """'has_bill_shape::curved_(up_or_down)' -> 'curved (up or down) bill shape' (usable in a text prompt)."""
    family, _, value = name.partition("::")
    family = family.removeprefix("has_")
    return f"{value.replace('_', ' ')} {family.replace('_', ' ')}".strip()


def attribute_families(names: Sequence[str]) -> dict[str, list[int]]:
    """Family (the part before '::') -> attribute columns, in order of first appearance."""
    families: dict[str, list[int]] = {}
    for column, name in enumerate(names):
        families.setdefault(name.partition("::")[0], []).append(column)
    return families


def class_phrase(name: str) -> str:
    """'001.Black_footed_Albatross' -> 'Black footed Albatross'."""
    return re.sub(r"^\d+\.", "", name).replace("_", " ").strip()


def bird_caption(class_name: str, present: np.ndarray, names: Sequence[str], families: dict[str, list[int]]) -> str:
    """'a photo of a <class>, a bird with <primary colour>, <bill shape> and <size>.'

    present: bool (A,) the image's attributes. For each family in CAPTION_FAMILIES the first present value
    is named; families with none present (or absent from `families`) are left out.
    """
    phrases = []
    for family in CAPTION_FAMILIES:
        hits = [c for c in families.get(family, []) if present[c]]
        if hits:
            phrases.append(attribute_phrase(names[hits[0]]))
    tail = f" with {join_words(phrases)}" if phrases else ""
    return f"a photo of {with_article(class_name)}, a bird{tail}."


# ---------------------------------------------------------------------------------------------------------
# id tables


def _id_rows(path: Path, columns: list[str]) -> tuple[np.ndarray, list[str], list[int]]:
    """(first-column ids int64, second fields, line numbers) of a two-column CUB file."""
    rows = read_fields(path, columns, "CUB")
    ids = np.array([parse_int(fields[0], f"{path}:{number}", columns[0]) for number, fields in rows], dtype=np.int64)
    return ids, [fields[1] for _, fields in rows], [number for number, _ in rows]


def _lookup(known: np.ndarray, query: np.ndarray, where: Sequence[str], what: str, source: str) -> np.ndarray:
    """Positions of `query` ids in `known` (unique ids); LayoutError naming the first unknown one."""
    order = np.argsort(known, kind="stable")
    position = np.clip(np.searchsorted(known[order], query), 0, max(len(known) - 1, 0))
    found = known[order][position] == query if len(known) else np.zeros(len(query), dtype=bool)
    if not found.all():
        first = int(np.flatnonzero(~found)[0])
        raise LayoutError(f"{where[first]}: {what} {int(query[first])} not found in {source}")
    return order[position]


def _check_unique(ids: np.ndarray, lines: Sequence[int], path: Path, what: str) -> None:
    unique, first_index, counts = np.unique(ids, return_index=True, return_counts=True)
    if (counts > 1).any():
        dup = unique[counts > 1][0]
        second = np.flatnonzero(ids == dup)[1]
        raise LayoutError(f"{path}:{lines[second]}: duplicate {what} {int(dup)}")


def _one_each(rows: np.ndarray, n: int, path: Path, lines: Sequence[int], image_ids: np.ndarray) -> None:
    """Every image row listed exactly once in a per-image file."""
    counts = np.bincount(rows, minlength=n)
    if (counts > 1).any():
        dup = int(np.flatnonzero(counts > 1)[0])
        raise LayoutError(f"{path}:{lines[np.flatnonzero(rows == dup)[1]]}: image_id {int(image_ids[dup])} listed twice")
    if (counts == 0).any():
        missing = int(np.flatnonzero(counts == 0)[0])
        raise LayoutError(f"{path}: image_id {int(image_ids[missing])} (from images.txt) has no line "
                          f"({int((counts == 0).sum())} images missing)")


# ---------------------------------------------------------------------------------------------------------
# the attribute label file


def _read_attribute_labels(path: Path) -> np.ndarray:
    """int64 (m, 3): image_id, attribute_id, is_present of every record. Fast path: numpy's C parser."""
    if not path.is_file():
        raise LayoutError(f"CUB: missing file {path} (expected lines '{' '.join(_LABEL_COLUMNS)}')")
    try:
        values = np.loadtxt(path, usecols=(0, 1, 2, 3, 4), dtype=np.float64, ndmin=2)
    except ValueError:
        _diagnose_attribute_labels(path)
        raise  # pragma: no cover - the diagnosis always raises when loadtxt does
    if len(values) == 0:
        raise LayoutError(f"{path}: file is empty (expected lines '{' '.join(_LABEL_COLUMNS)}')")
    head = values[:, :3]
    bad = np.flatnonzero((head != np.round(head)).any(axis=1))
    if len(bad):
        raise LayoutError(f"{path}: record {bad[0] + 1}: image_id, attribute_id and is_present must be integers, "
                          f"got {head[bad[0]].tolist()}")
    return head.astype(np.int64)


def _diagnose_attribute_labels(path: Path) -> None:
    """Find the first malformed line (slow, only after the fast parser failed) and raise LayoutError for it."""
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) < len(_LABEL_COLUMNS):
                raise LayoutError(f"{path}:{number}: expected at least {len(_LABEL_COLUMNS)} fields "
                                  f"'{' '.join(_LABEL_COLUMNS)}', got {len(fields)}: {line.strip()!r}")
            for column, field in zip(_LABEL_COLUMNS, fields):
                try:
                    float(field)
                except ValueError:
                    raise LayoutError(f"{path}:{number}: {column} must be a number, got {field!r}") from None
    raise LayoutError(f"{path}: unparsable (expected lines '{' '.join(_LABEL_COLUMNS)}')")


# ---------------------------------------------------------------------------------------------------------
# the loader


def load_cub(root: Path | str, val_fraction: float = 0.1, seed: int = 0, check: bool = True) -> ImageTable:
    """Load CUB-200-2011 from its released layout (see the module docstring) as an ImageTable of kind "cub".

    val_fraction: share of the official training images moved to validation (stratified by class, seeded
    by `seed`). check: open every image's header first (11,788 files, about a second).
    Returns attributes bool (n, A=312), families {"has_bill_shape": [...], ...} (28 families in the release),
    labels int64 (n,) in [0, 200), captions from the class and a few attributes, paths root/images/<path>.
    Raises LayoutError (missing file, unparsable line, wrong field count, unknown or duplicate id, an image
    or attribute without labels) or BadImage (an image file missing or unreadable), before any other work.
    """
    root = Path(root)
    if not 0.0 <= float(val_fraction) < 1.0:
        raise ValueError(f"val_fraction: expected a fraction in [0, 1), got {val_fraction!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    if not root.is_dir():
        raise LayoutError(f"CUB: root {root} is not a directory (expected the CUB_200_2011 folder with images.txt ...)")

    images_txt = root / "images.txt"
    image_ids, rel_paths, image_lines = _id_rows(images_txt, ["image_id", "path"])
    _check_unique(image_ids, image_lines, images_txt, "image_id")
    n = len(image_ids)

    classes_txt = root / "classes.txt"
    class_ids, raw_class_names, class_lines = _id_rows(classes_txt, ["class_id", "class_name"])
    _check_unique(class_ids, class_lines, classes_txt, "class_id")
    class_order = np.argsort(class_ids, kind="stable")
    class_names = [class_phrase(raw_class_names[i]) for i in class_order]
    class_rank = np.empty(len(class_ids), dtype=np.int64)
    class_rank[class_order] = np.arange(len(class_ids))

    labels_txt = root / "image_class_labels.txt"
    label_image_ids, label_class_text, label_lines = _id_rows(labels_txt, ["image_id", "class_id"])
    where = [f"{labels_txt}:{line}" for line in label_lines]
    rows = _lookup(image_ids, label_image_ids, where, "image_id", "images.txt")
    _one_each(rows, n, labels_txt, label_lines, image_ids)
    label_class_ids = np.array([parse_int(t, w, "class_id") for t, w in zip(label_class_text, where)], dtype=np.int64)
    labels = np.empty(n, dtype=np.int64)
    labels[rows] = class_rank[_lookup(class_ids, label_class_ids, where, "class_id", "classes.txt")]

    split_txt = root / "train_test_split.txt"
    split_image_ids, split_text, split_lines = _id_rows(split_txt, ["image_id", "is_training_image"])
    where = [f"{split_txt}:{line}" for line in split_lines]
    rows = _lookup(image_ids, split_image_ids, where, "image_id", "images.txt")
    _one_each(rows, n, split_txt, split_lines, image_ids)
    is_train_values = np.array([parse_int(t, w, "is_training_image") for t, w in zip(split_text, where)], dtype=np.int64)
    bad = np.flatnonzero((is_train_values != 0) & (is_train_values != 1))
    if len(bad):
        raise LayoutError(f"{where[bad[0]]}: is_training_image must be 0 or 1, got {int(is_train_values[bad[0]])}")
    is_train = np.zeros(n, dtype=bool)
    is_train[rows] = is_train_values == 1

    attribute_path = find_attribute_list(root)
    raw_names = read_attribute_list(attribute_path)
    n_attributes = len(raw_names)
    if n_attributes != 312:
        log.warning("CUB: %s lists %d attributes; the release has 312", attribute_path, n_attributes)

    labels_path = root / "attributes" / "image_attribute_labels.txt"
    records = _read_attribute_labels(labels_path)
    where_record = _RecordNames(labels_path)
    rows = _lookup(image_ids, records[:, 0], where_record, "image_id", "images.txt")
    columns = records[:, 1] - 1
    bad = np.flatnonzero((columns < 0) | (columns >= n_attributes))
    if len(bad):
        raise LayoutError(f"{where_record[bad[0]]}: attribute_id {int(records[bad[0], 1])} not found in "
                          f"{attribute_path.name} (ids 1..{n_attributes})")
    bad = np.flatnonzero((records[:, 2] != 0) & (records[:, 2] != 1))
    if len(bad):
        raise LayoutError(f"{where_record[bad[0]]}: is_present must be 0 or 1, got {int(records[bad[0], 2])}")
    flat = rows * n_attributes + columns
    counts = np.bincount(flat, minlength=n * n_attributes)
    if (counts != 1).any():
        cell = int(np.flatnonzero(counts != 1)[0])
        image, attribute = divmod(cell, n_attributes)
        raise LayoutError(f"{labels_path}: image_id {int(image_ids[image])} attribute_id {attribute + 1} has "
                          f"{int(counts[cell])} records (expected exactly one per image and attribute)")
    attributes = np.zeros(n * n_attributes, dtype=bool)
    attributes[flat] = records[:, 2] == 1
    attributes = attributes.reshape(n, n_attributes)

    paths = [root / "images" / p for p in rel_paths]
    if check:
        check_image_files(paths, "listed in images.txt")
    else:
        missing = next((p for p in paths if not p.is_file()), None)
        if missing is not None:
            raise BadImage(missing, "file not found (listed in images.txt)")

    split = np.full(n, 2, dtype=np.int8)
    train_rows = np.flatnonzero(is_train)
    split[train_rows] = assign_split(labels[train_rows], (1.0 - float(val_fraction), float(val_fraction), 0.0), int(seed))
    families = attribute_families(raw_names)
    captions = [bird_caption(class_names[labels[i]], attributes[i], raw_names, families) for i in range(n)]
    log.info("CUB: %d images, %d classes, %d attributes in %d families under %s",
             n, len(class_names), n_attributes, len(families), root)
    return ImageTable("cub", paths, attributes, [attribute_phrase(name) for name in raw_names], families,
                      captions, split, labels, class_names)


class _RecordNames:
    """where[k] -> 'path: record k+1' without building millions of strings up front."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __getitem__(self, index: int) -> str:
        return f"{self.path}: record {int(index) + 1}"
