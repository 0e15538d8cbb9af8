"""JSON records: strict JSON (an undefined number is `null` with its reason beside it) written atomically.

Metrics, curves and explanations are JSON files that DVC tracks and the report reads. `jsonable` turns numpy
scalars and arrays into Python values and every non-finite float into None, so the files are valid JSON for any
reader; `write_json` writes such a record to a temporary sibling and renames it into place, so a killed stage
never leaves a half-written file.

Undefined values: a metric that has no value on its input (a concept no code can split, no pair to score)
returns `Undefined(reason)`, a NaN that carries why. In a record, a NaN under key `x` of a mapping is written as
`"x": null` next to `"x_undefined": "<reason>"` (the reason of an `Undefined`; "not a number" or "infinite" for
any other non-finite number). Arithmetic keeps the reason (`Undefined - 0.3` is the same `Undefined`), so a delta
of an undefined score says why too. A NaN inside a list is written as null alone.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.atomic import write_text_atomic


class Undefined(float):
    """NaN with the reason the value is undefined (see the module docstring); behaves as NaN in every computation."""

    reason: str

    def __new__(cls, reason: str) -> "Undefined":
        value = super().__new__(cls, "nan")
        value.reason = str(reason)
        return value

    def __repr__(self) -> str:
        return f"Undefined({self.reason!r})"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return Undefined, (self.reason,)

    def _keep(self, other: Any) -> "Undefined":  # NaN combined with anything is NaN: keep the reason
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _keep

    def __neg__(self) -> "Undefined":
        return self


def undefined_reason(value: Any) -> str | None:
    """Why `value` is not a finite number (an `Undefined`'s reason, else "not a number" or "infinite"), or None otherwise."""
    if isinstance(value, Undefined):
        return value.reason
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        return "not a number" if math.isnan(value) else "infinite"
    return None


def json_number(value: float | int) -> float | int | None:
    """A number for JSON: ints stay ints, NaN and infinities become None."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    value = float(value)
    return value if math.isfinite(value) else None


def jsonable(obj: Any) -> Any:
    """`obj` with numpy values turned into Python ones and non-finite floats into None (recursively); in a mapping,
    each such None gets its reason beside it under `<key>_undefined`."""
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            out[str(key)] = jsonable(value)
            reason = undefined_reason(value)
            if reason is not None:
                out[f"{key}_undefined"] = reason
        return out
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
    write_text_atomic(Path(path), json.dumps(jsonable(obj), indent=indent, allow_nan=False))
