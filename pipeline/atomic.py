"""Writing outputs so that a killed process never leaves one that looks finished: the one helper every writer uses.

A file or directory is built under a temporary sibling name and renamed onto its final name only when complete
(`os.replace`, atomic on one filesystem). A reader therefore sees the previous complete output or the new complete
one, never a half-written one, and a killed writer leaves at most a `*.tmp` sibling that the next run removes (or,
for the resumable writers, continues: extraction's stores, training's epoch checkpoints).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def temporary_sibling(target: Path) -> Path:
    """`<target>.tmp` beside `target`: where its next version is built."""
    target = Path(target)
    return target.with_name(target.name + ".tmp")


def replace_dir(src: Path, dst: Path) -> None:
    """Move directory `src` onto `dst`, replacing an existing `dst` (the old copy is moved aside, then removed)."""
    src, dst = Path(src), Path(dst)
    old = dst.with_name(dst.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    if old.exists():
        shutil.rmtree(old)


@contextmanager
def atomic_dir(target: Path, *, resume: bool = False) -> Iterator[Path]:
    """Build directory `target` in its temporary sibling, yielded; it replaces `target` when the block ends without an
    exception. resume=False: a sibling left by a killed run is removed first (the block starts empty); True: it is
    kept for a writer that resumes from it. On an exception the sibling stays as it is (a resumable writer continues
    there next time; any other is started afresh)."""
    tmp = temporary_sibling(target)
    if tmp.exists() and not resume:
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    yield tmp
    replace_dir(tmp, target)


@contextmanager
def atomic_file(target: Path) -> Iterator[Path]:
    """Write file `target` through a temporary sibling, yielded (its parent directory is created); it replaces
    `target` when the block ends without an exception, and is removed otherwise."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(target)
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(target: Path, text: str) -> None:
    """`target.write_text(text)`, atomically."""
    with atomic_file(target) as tmp:
        tmp.write_text(text)
