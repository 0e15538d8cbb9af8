"""JSON records: strict JSON (an undefined number is `null`, never a bare NaN) written atomically.

Metrics, curves and explanations are JSON files that DVC tracks and the report reads. `jsonable` turns numpy
scalars and arrays into Python values and every non-finite float into None, so the files are valid JSON for any
reader; `write_json` writes such a record to a temporary sibling and renames it into place, so a killed stage
never leaves a half-written file.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np


def json_number(value: float | int) -> float | int | None:
    """A number for JSON: ints stay ints, NaN and infinities become None."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    value = float(value)
    return value if math.isfinite(value) else None


def jsonable(obj: Any) -> Any:
    """`obj` with numpy values turned into Python ones and non-finite floats into None (recursively)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, float, np.integer, np.floating)):
        return json_number(obj)
    return obj


def write_json(path: Path, obj: Any, indent: int | None = 1) -> None:
    """Write `jsonable(obj)` as strict JSON to `path` atomically (a temporary sibling renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(jsonable(obj), indent=indent, allow_nan=False))
    os.replace(tmp, path)
