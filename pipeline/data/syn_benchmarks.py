"""synCUB / synCOCO intervention pairs (docs/science.md §3) -> (ImageTable of the base images, PairTable of the pairs).

What is assumed, and where it comes from. The benchmarks are published as Hub dataset repositories
`jokl/syncub` and `jokl/syncoco`. According to the authors' code (README and the export scripts
`src/scripts/hf_export/export_syn{cub,coco}_hf.py` of github.com/JonasKlotz/sae-concept-eval; we could
not open the Hub repositories themselves from here), each repository is a plain file tree, not a
`datasets` table::

    metadata.csv      one row per pair (columns below); list columns hold "[3, 17, 250]"
    images/           000000_orig.jpg (the base image) and 000000_syn.jpg (the edited image), ...
    attributes.txt    synCUB only: the CUB attribute list "<1-based id> <has_family::value>"

synCUB columns: pair_id, orig_image, syn_image (paths relative to the root), class_id (1-based CUB class),
class_name, old_attr, new_attr (CUB attribute names), old_attr_idx, new_attr_idx (0-based columns),
orig_attr_idx, syn_attr_idx (0-based present attributes of each side). One attribute value is replaced by
another: removed = old_attr_idx, added = new_attr_idx, family = the old attribute's family.

synCOCO columns: pair_id, orig_image, syn_image, coco_idx (the COCO image id), removed_cls_idx (0-based,
COCO categories in id order = `coco.COCO_CATEGORY_NAMES`), removed_class (its name), orig_labels,
syn_labels (0-based present categories). One object is removed: removed = removed_cls_idx, added = -1,
family "object".

A local copy is any folder in that layout (e.g. `hf download jokl/syncub --repo-type dataset --local-dir
DIR`); the variant is told by the columns. Named access (`"jokl/syncub"`, `"syncub"`, ...) downloads the
repository with `huggingface_hub.snapshot_download` (installed with transformers) — the authors' own way;
`datasets.load_dataset` would not keep the pair structure of this file tree. With `HF_HUB_OFFLINE=1` only
an already cached snapshot is used, and a missing one fails at once.

Checks, before anything is returned: the required columns, one line per pair with every field, integer
and list fields, indices in range, and that the index columns agree with the name columns
(old_attr == attributes.txt[old_attr_idx], removed_class == COCO_CATEGORY_NAMES[removed_cls_idx]) — which
catches a 0-/1-based mix-up. Pairs whose labels do not show the edit (removed not present before, or
still present after) are kept and counted in a warning: the published curation decides what a pair is.

The ImageTable holds each distinct base image once (rows in order of first use; PairTable.base_index
points into it), all in split 2 (test): the pairs are an evaluation set.
"""

from __future__ import annotations

import csv
import logging
import os
from pathlib import Path

import numpy as np

from pipeline.data.coco import COCO_CATEGORY_NAMES, coco_caption
from pipeline.data.cub import attribute_families, attribute_phrase, bird_caption, class_phrase, read_attribute_list
from pipeline.data.images import BadImage, check_image_files
from pipeline.data.table import ImageTable, LayoutError, PairTable

log = logging.getLogger(__name__)

__all__ = ["load_syn", "fetch_syn", "HubUnavailable", "HUB_REPOS", "DEFAULT_REVISIONS", "SYNCUB_COLUMNS", "SYNCOCO_COLUMNS"]

HUB_REPOS = {"syncub": "jokl/syncub", "syncoco": "jokl/syncoco"}
# the versions the authors' README downloads; pass `revision` for another tag, branch or commit
DEFAULT_REVISIONS = {"jokl/syncub": "v1.0", "jokl/syncoco": "v2.0"}
SYNCUB_COLUMNS = ("orig_image", "syn_image", "class_id", "class_name", "old_attr", "new_attr",
                  "old_attr_idx", "new_attr_idx", "orig_attr_idx", "syn_attr_idx")
SYNCOCO_COLUMNS = ("orig_image", "syn_image", "removed_cls_idx", "removed_class", "orig_labels", "syn_labels")
_HINT = ("install `huggingface_hub` and configure network access (unset HF_HUB_OFFLINE), "
         "or pass a local copy: a folder with metadata.csv and images/")


class HubUnavailable(RuntimeError):
    """A named benchmark could not be fetched (no huggingface_hub, offline without a cached copy, no network)."""


# ---------------------------------------------------------------------------------------------------------
# where the files come from


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def fetch_syn(name: str, revision: str | None = None, cache_dir: Path | str | None = None) -> Path:
    """Download (or find in the Hub cache) `jokl/syncub` or `jokl/syncoco`; returns the local snapshot folder.

    name: "jokl/syncub", "syncub", "synCUB", ... revision: default DEFAULT_REVISIONS[repo].
    Raises HubUnavailable with what to do when huggingface_hub is missing, when HF_HUB_OFFLINE=1 and no
    cached snapshot exists, or when the download fails.
    """
    key = name.strip().lower().removeprefix("jokl/")
    if key not in HUB_REPOS:
        raise ValueError(f"name: expected one of {sorted(HUB_REPOS.values())}, got {name!r}")
    repo = HUB_REPOS[key]
    revision = revision or DEFAULT_REVISIONS[repo]
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise HubUnavailable(f"{repo}: huggingface_hub is not installed; {_HINT}") from None
    offline = _offline()
    try:
        folder = snapshot_download(repo, repo_type="dataset", revision=revision, cache_dir=cache_dir,
                                   local_files_only=offline)
    except Exception as error:  # the hub raises many kinds (connection, HTTP, cache misses)
        why = "HF_HUB_OFFLINE=1 and no cached copy" if offline else f"{type(error).__name__}: {error}"
        raise HubUnavailable(f"{repo}@{revision}: cannot fetch ({why}); {_HINT}") from None
    return Path(str(folder))


# ---------------------------------------------------------------------------------------------------------
# metadata.csv


def _read_metadata(path: Path) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """Header and (line number, row) of a CSV file; LayoutError for a row with too few or too many fields."""
    if not path.is_file():
        raise LayoutError(f"syn: missing file {path} (expected metadata.csv with one row per pair; "
                          f"synCUB columns {', '.join(SYNCUB_COLUMNS)}; synCOCO columns {', '.join(SYNCOCO_COLUMNS)})")
    rows = []
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = list(reader.fieldnames or [])
        for row in reader:
            extra = row.pop(None, None)  # type: ignore[call-overload]  # DictReader's key for surplus fields
            absent = sum(value is None for value in row.values())
            if extra or absent:
                count = len(header) + len(extra or []) - absent
                raise LayoutError(f"{path}:{reader.line_num}: expected {len(header)} fields ({', '.join(header)}), got {count}")
            rows.append((reader.line_num, row))
    if not header:
        raise LayoutError(f"{path}: empty file (expected a header line and one row per pair)")
    if not rows:
        raise LayoutError(f"{path}: no pairs (only a header)")
    return header, rows


def _int(row: dict[str, str], column: str, where: str, low: int, high: int) -> int:
    """row[column] as an integer in [low, high)."""
    text = row[column].strip()
    try:
        value = int(text)
    except ValueError:
        raise LayoutError(f"{where}: {column} must be an integer, got {text!r}") from None
    if not low <= value < high:
        raise LayoutError(f"{where}: {column} {value} out of range (expected {low}..{high - 1})")
    return value


def _index_list(row: dict[str, str], column: str, where: str, high: int) -> list[int]:
    """row[column] = "[3, 17, 250]" (or "[]") -> the integers, each in [0, high)."""
    text = row[column].strip()
    if not (text.startswith("[") and text.endswith("]")):
        raise LayoutError(f"{where}: {column} must be a list like [3, 17], got {text!r}")
    inner = text[1:-1].strip()
    try:
        values = [int(part) for part in inner.split(",")] if inner else []
    except ValueError:
        raise LayoutError(f"{where}: {column} must be a list of integers like [3, 17], got {text!r}") from None
    bad = [v for v in values if not 0 <= v < high]
    if bad:
        raise LayoutError(f"{where}: {column} has index {bad[0]} out of range (expected 0..{high - 1})")
    return values


def _image_path(root: Path, row: dict[str, str], column: str, where: str) -> Path:
    text = row[column].strip()
    if not text:
        raise LayoutError(f"{where}: {column} is empty (expected a path relative to {root})")
    return root / text


def _multi_hot(lists: list[list[int]], width: int) -> np.ndarray:
    out = np.zeros((len(lists), width), dtype=bool)
    rows = np.repeat(np.arange(len(lists)), [len(values) for values in lists])
    out[rows, np.concatenate([np.asarray(values, dtype=np.int64) for values in lists] + [np.zeros(0, np.int64)])] = True
    return out


# ---------------------------------------------------------------------------------------------------------
# the loader


def load_syn(name_or_path: str | Path, revision: str | None = None, cache_dir: Path | str | None = None,
             check: bool = True) -> tuple[ImageTable, PairTable]:
    """Load synCUB or synCOCO (see the module docstring) from a local folder or by Hub name.

    name_or_path: an existing folder in the published layout, or "jokl/syncub" / "jokl/syncoco" (also
    "syncub", "synCOCO", ...) fetched with `fetch_syn(name, revision, cache_dir)`.
    check: open every image header first (BadImage names the first bad file); otherwise only existence.
    Returns (ImageTable of kind "syncub" | "syncoco" with the distinct base images, all split 2, and
    PairTable with p pairs whose base_index points into it).
    """
    path = Path(name_or_path)
    if path.is_dir():
        root = path
    elif str(name_or_path).strip().lower().removeprefix("jokl/") in HUB_REPOS:
        root = fetch_syn(str(name_or_path), revision, cache_dir)
    else:
        raise LayoutError(f"syn: {name_or_path!s} is neither a local folder nor one of "
                          f"{', '.join(sorted(HUB_REPOS.values()))}")
    metadata = root / "metadata.csv"
    header, rows = _read_metadata(metadata)
    columns = set(header)
    if columns >= set(SYNCUB_COLUMNS):
        table, pairs = _load_syncub(root, metadata, rows)
    elif columns >= set(SYNCOCO_COLUMNS):
        table, pairs = _load_syncoco(metadata, root, rows)
    else:
        missing_cub = [c for c in SYNCUB_COLUMNS if c not in columns]
        missing_coco = [c for c in SYNCOCO_COLUMNS if c not in columns]
        raise LayoutError(f"{metadata}: not a synCUB or synCOCO table; synCUB needs columns {missing_cub}, "
                          f"synCOCO needs columns {missing_coco}")
    all_paths = table.paths + pairs.after
    if check:
        check_image_files(all_paths, f"listed in {metadata.name}")
    else:
        absent = next((p for p in all_paths if not p.is_file()), None)
        if absent is not None:
            raise BadImage(absent, f"file not found (listed in {metadata.name})")
    _warn_inconsistent(pairs, table.kind)
    log.info("%s: %d pairs over %d base images from %s", table.kind, len(pairs), len(table), root)
    return table, pairs


def _bases(before: list[Path], attributes: np.ndarray, lines: list[int], metadata: Path) -> tuple[np.ndarray, np.ndarray]:
    """(first pair row of each distinct base image, base_index per pair); a base image must keep its labels."""
    table_row: dict[Path, int] = {}
    first_rows: list[int] = []
    base_index = np.empty(len(before), dtype=np.int64)
    for j, image in enumerate(before):
        row = table_row.get(image)
        if row is None:
            row = table_row[image] = len(first_rows)
            first_rows.append(j)
        elif not np.array_equal(attributes[first_rows[row]], attributes[j]):
            raise LayoutError(f"{metadata}:{lines[j]}: base image {image} has other labels than on line {lines[first_rows[row]]}")
        base_index[j] = row
    return np.asarray(first_rows, dtype=np.int64), base_index


def _load_syncub(root: Path, metadata: Path, rows: list[tuple[int, dict[str, str]]]) -> tuple[ImageTable, PairTable]:
    attribute_path = root / "attributes.txt"
    if not attribute_path.is_file():
        raise LayoutError(f"synCUB: missing file {attribute_path} (expected the CUB attribute list "
                          "'<attribute_id> <has_family::value>', 312 lines)")
    names = read_attribute_list(attribute_path)
    a = len(names)
    families = attribute_families(names)
    before, after, lines, removed, added, family, class_ids = [], [], [], [], [], [], []
    before_lists, after_lists = [], []
    class_name_of: dict[int, str] = {}
    for number, row in rows:
        where = f"{metadata}:{number}"
        lines.append(number)
        before.append(_image_path(root, row, "orig_image", where))
        after.append(_image_path(root, row, "syn_image", where))
        class_id = _int(row, "class_id", where, 1, 1 << 31)
        class_ids.append(class_id)
        class_name_of.setdefault(class_id, class_phrase(row["class_name"]) or f"class {class_id}")
        for index_column, name_column, sink in (("old_attr_idx", "old_attr", removed), ("new_attr_idx", "new_attr", added)):
            index = _int(row, index_column, where, 0, a)
            if row[name_column].strip() != names[index]:
                raise LayoutError(f"{where}: {name_column} {row[name_column].strip()!r} does not match "
                                  f"{attribute_path.name} id {index + 1} {names[index]!r} ({index_column} is 0-based)")
            sink.append(index)
        family.append(names[removed[-1]].partition("::")[0])
        before_lists.append(_index_list(row, "orig_attr_idx", where, a))
        after_lists.append(_index_list(row, "syn_attr_idx", where, a))
    before_attributes, after_attributes = _multi_hot(before_lists, a), _multi_hot(after_lists, a)
    cross = [j for j in range(len(rows)) if names[added[j]].partition("::")[0] != family[j]]
    if cross:
        log.warning("synCUB: %d pairs replace a value by one of another family (first: %s line %d)",
                    len(cross), metadata.name, lines[cross[0]])
    first_rows, base_index = _bases(before, before_attributes, lines, metadata)
    labels = np.asarray(class_ids, dtype=np.int64)[first_rows] - 1
    class_names = [class_name_of.get(c, f"class {c}") for c in range(1, max(class_ids) + 1)]
    base_attributes = before_attributes[first_rows]
    captions = [bird_caption(class_names[labels[i]], base_attributes[i], names, families) for i in range(len(first_rows))]
    table = ImageTable("syncub", [before[j] for j in first_rows], base_attributes, [attribute_phrase(n) for n in names],
                       families, captions, np.full(len(first_rows), 2, dtype=np.int8), labels, class_names)
    pairs = PairTable(before, after, before_attributes, after_attributes, base_index, family,
                      np.asarray(removed, dtype=np.int64), np.asarray(added, dtype=np.int64))
    return table, pairs


def _load_syncoco(metadata: Path, root: Path, rows: list[tuple[int, dict[str, str]]]) -> tuple[ImageTable, PairTable]:
    names = list(COCO_CATEGORY_NAMES)
    a = len(names)
    before, after, lines, removed, before_lists, after_lists = [], [], [], [], [], []
    for number, row in rows:
        where = f"{metadata}:{number}"
        lines.append(number)
        before.append(_image_path(root, row, "orig_image", where))
        after.append(_image_path(root, row, "syn_image", where))
        index = _int(row, "removed_cls_idx", where, 0, a)
        if row["removed_class"].strip() != names[index]:
            raise LayoutError(f"{where}: removed_class {row['removed_class'].strip()!r} does not match COCO category "
                              f"{index} {names[index]!r} (removed_cls_idx is 0-based, categories in id order)")
        removed.append(index)
        before_lists.append(_index_list(row, "orig_labels", where, a))
        after_lists.append(_index_list(row, "syn_labels", where, a))
    before_attributes, after_attributes = _multi_hot(before_lists, a), _multi_hot(after_lists, a)
    first_rows, base_index = _bases(before, before_attributes, lines, metadata)
    base_attributes = before_attributes[first_rows]
    captions = [coco_caption([names[c] for c in np.flatnonzero(row)]) for row in base_attributes]
    table = ImageTable("syncoco", [before[j] for j in first_rows], base_attributes, names, {"object": list(range(a))},
                       captions, np.full(len(first_rows), 2, dtype=np.int8), None, None)
    pairs = PairTable(before, after, before_attributes, after_attributes, base_index, ["object"] * len(rows),
                      np.asarray(removed, dtype=np.int64), np.full(len(rows), -1, dtype=np.int64))
    return table, pairs


def _warn_inconsistent(pairs: PairTable, kind: str) -> int:
    """Count (and log) pairs whose labels do not show the edit; returns the count."""
    rows = np.arange(len(pairs))
    bad = ~pairs.before_attributes[rows, pairs.removed] | pairs.after_attributes[rows, pairs.removed]
    has_added = pairs.added >= 0
    bad[has_added] |= ~pairs.after_attributes[rows[has_added], pairs.added[has_added]]
    count = int(bad.sum())
    if count:
        log.warning("%s: %d of %d pairs have labels that do not show the edit (removed attribute absent before "
                    "or present after, or added attribute absent after); kept as published", kind, count, len(pairs))
    return count
