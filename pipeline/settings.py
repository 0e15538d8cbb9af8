"""The one way a component declares its options: a frozen, validated dataclass.

Every component of the library (each model, the training loop, the embedded encoder, the caption
decoder, the explanations, the evaluation, the data sources) owns one `@settings` dataclass of its
options. The class is the documentation (fields, defaults, constraints) and the validator: it checks
its values when it is built, from Python or from params.yaml, so a bad value fails with a message
naming the field before any work starts. `pipeline.config` composes these classes into the schema of
params.yaml; nothing else re-lists their fields.

Numbers are strict: a YAML `true` is not an int, the string "3" is not a number, and NaN or infinity is
never accepted (`allow_inf_nan=False`). An int is accepted where a float is expected.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, PlainValidator, Strict
from pydantic.dataclasses import dataclass

T = TypeVar("T")

#: shared by every settings class: unknown keys are errors, floats must be finite.
CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False, validate_default=False)



def _python_number(value: object) -> object:
    """numpy scalars become Python numbers (numpy's bool stays a bool and is refused)."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


_NUMBER = BeforeValidator(_python_number)

# Constrained field types (strict: booleans and strings are refused where numbers are expected).
Bool = Annotated[bool, Strict()]
Int = Annotated[int, Strict(), _NUMBER]
PositiveInt = Annotated[int, Strict(), Field(ge=1), _NUMBER]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0), _NUMBER]
Float = Annotated[float, Strict(), _NUMBER]
PositiveFloat = Annotated[float, Strict(), Field(gt=0), _NUMBER]
NonNegativeFloat = Annotated[float, Strict(), Field(ge=0), _NUMBER]
Fraction = Annotated[float, Strict(), Field(ge=0, le=1), _NUMBER]
OpenFraction = Annotated[float, Strict(), Field(ge=0, lt=1), _NUMBER]


def _positive_or_auto(value: object) -> float | str:
    if value == "auto":
        return "auto"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"expected a finite number > 0 or 'auto', got {value!r}")
    return float(value)


_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def check_device(name: str) -> str:
    """`name` if it is a device this project knows ("auto", "cpu", "cuda", "cuda:<index>", "mps"), else ValueError."""
    if not isinstance(name, str) or not _DEVICE.fullmatch(name):
        raise ValueError(f"unknown device {name!r}; expected 'auto', 'cpu', 'cuda', 'cuda:<index>' or 'mps'")
    return name


#: a settings field naming a torch device (validated by `check_device`; `pipeline.training.device` resolves it)
Device = Annotated[str, AfterValidator(check_device)]


#: a positive finite number, or "auto" (the component computes it; e.g. the training loop's learning rate)
PositiveOrAuto = Annotated[float | Literal["auto"], PlainValidator(_positive_or_auto)]


def settings(cls: type[T]) -> type[T]:
    """Make `cls` a frozen settings dataclass validated on construction (see the module docstring).

    Validation errors are `pydantic.ValidationError`s (a `ValueError`); `pipeline.config` (its `_format`)
    turns them into one line per problem naming the key.
    """
    return dataclass(frozen=True, config=CONFIG)(cls)  # type: ignore[return-value]



def defaults_from(default: Any) -> BeforeValidator:
    """For a nested settings field: a mapping that gives only some fields takes the others from `default` (an
    instance), not from the class's own defaults. `train: Annotated[TrainSettings, defaults_from(EMBEDDED_TRAIN)]`
    lets params.yaml write `train: {epochs: 20}` and keep the component's learning rate and weight decay."""

    def merge(value: Any) -> Any:
        return {**dataclasses.asdict(default), **value} if isinstance(value, dict) else value

    return BeforeValidator(merge)
