"""Provenance recorded in stores, checkpoints and reports: content digests of params slices, files and source code."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np


def digest(obj: Any) -> str:
    """Short sha256 of a JSON-able object (sorted keys): a stable content id for params slices."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def rows_digest(rows: np.ndarray) -> str:
    """Short sha256 of an int array of row indices (its int64 bytes): no Python list of a million ints on the way."""
    return hashlib.sha256(np.ascontiguousarray(rows, dtype=np.int64).tobytes()).hexdigest()[:16]


def file_digest(path: Path) -> str:
    """Short sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def source_digest(paths: tuple[str, ...], root: Path) -> str:
    """Short sha256 of the .py files under `paths` (files or folders relative to `root`): names and contents."""
    files = sorted(f for entry in paths for f in ((root / entry).rglob("*.py") if (root / entry).is_dir() else [root / entry]))
    return digest([(f.relative_to(root).as_posix(), file_digest(f)) for f in files])


#: the project's root: the code paths `code_digest` names are relative to it
CODE_ROOT = Path(__file__).resolve().parents[1]


def code_digest(paths: tuple[str, ...]) -> str:
    """Digest of the source of `paths` (files or folders relative to the project root; a stage lists its dvc.yaml code
    deps): what outputs record as the code that made them. It depends on the code's content only, so the same code
    writes byte-identical outputs whatever the git commit or working-tree state."""
    return source_digest(paths, CODE_ROOT)
