"""ImageNet-style class folders: `root/<class>/<image>` -> an ImageTable with one-hot class attributes.

The layout of torchvision's ImageFolder: every sub-folder of `root` is one class; every image file below it
(at any depth, suffix in `table.IMAGE_EXTENSIONS`, case-insensitive) is one example of that class. Hidden
files and folders (".DS_Store", ".cache/") are skipped; other files with a non-image suffix are skipped with
a warning. Classes and files are sorted, so the table (and its seeded, class-stratified split) is the same
on every machine. Used for linear probes (docs/science.md §3: LP needs the dataset's classes).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from pipeline.data.images import check_image_files
from pipeline.data.table import IMAGE_EXTENSIONS, ImageTable, LayoutError, assign_split, check_fractions, with_article

log = logging.getLogger(__name__)

__all__ = ["load_folders"]


def _visible(path: Path, root: Path) -> bool:
    return not any(part.startswith(".") for part in path.relative_to(root).parts)


def load_folders(root: Path | str, split: tuple[float, float, float] = (0.8, 0.1, 0.1), seed: int = 0,
                 names: Mapping[str, str] | None = None, check: bool = True) -> ImageTable:
    """Load `root/<class>/*.{jpg,jpeg,png,...}` as an ImageTable of kind "folders".

    split: (train, validation, test) fractions, applied within each class (stratified), seeded by `seed`.
    names: optional folder name -> class name ("n01440764" -> "tench"; ImageNet users pass the synset
    mapping); by default a folder's name with underscores as spaces. attributes: bool (n, C) one-hot
    classes, attribute_names = class names, families {"class": all columns}, labels int64 (n,) class
    index, captions "a photo of a <class>.".
    check: open every image's header first (BadImage names the first bad file); about 0.1 ms per image,
    pass False to skip it for very large folders.
    Raises LayoutError when root is missing, has no class folders, has images outside class folders, or a
    class folder holds no image.
    """
    root = Path(root)
    fractions = check_fractions(split)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    if not root.is_dir():
        raise LayoutError(f"folders: root {root} is not a directory (expected root/<class>/<image files>)")
    entries = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    loose = [p for p in entries if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS]
    if loose:
        raise LayoutError(f"folders: {loose[0]} lies directly in {root} ({len(loose)} such images); "
                          "expected root/<class>/<image files>, one sub-folder per class")
    class_dirs = [p for p in entries if p.is_dir()]
    if not class_dirs:
        raise LayoutError(f"folders: {root} has no class sub-folders (expected root/<class>/<image files>)")
    names = dict(names or {})
    unknown = sorted(set(names) - {d.name for d in class_dirs})
    if unknown:
        raise ValueError(f"names: folder names not found under {root}: {unknown[:5]}")

    paths: list[Path] = []
    counts: list[int] = []
    skipped = 0
    for class_dir in class_dirs:
        files = sorted(p for p in class_dir.rglob("*") if p.is_file() and _visible(p, root))
        images = [p for p in files if p.suffix.lower() in IMAGE_EXTENSIONS]
        skipped += len(files) - len(images)
        if not images:
            raise LayoutError(f"folders: class folder {class_dir} has no image files "
                              f"(expected suffixes {', '.join(IMAGE_EXTENSIONS)})")
        paths.extend(images)
        counts.append(len(images))
    if skipped:
        log.warning("folders: skipped %d files without an image suffix under %s", skipped, root)
    if check:
        check_image_files(paths, f"class folder image under {root}")

    class_names = [names.get(d.name, d.name.replace("_", " ")) for d in class_dirs]
    labels = np.repeat(np.arange(len(class_dirs), dtype=np.int64), counts)
    attributes = np.zeros((len(paths), len(class_dirs)), dtype=bool)
    attributes[np.arange(len(paths)), labels] = True
    captions = [f"a photo of {with_article(class_names[c])}." for c in labels]
    log.info("folders: %d images in %d classes under %s", len(paths), len(class_dirs), root)
    return ImageTable("folders", paths, attributes, list(class_names), {"class": list(range(len(class_dirs)))},
                      captions, assign_split(labels, fractions, int(seed)), labels, list(class_names))
