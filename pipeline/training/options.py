"""The training loop's options (params.yaml `train:`, and the `train:` blocks of `encoder` and `captions`): light
(no torch), so that the schema of params.yaml loads without the loop."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ByteSize, PlainValidator, TypeAdapter, ValidationError

from pipeline.settings import Device, Fraction, NonNegativeFloat, NonNegativeInt, PositiveInt, PositiveOrAuto, settings

_BYTES = TypeAdapter(ByteSize)


def _memory(value: object) -> float | str:
    """A fraction in (0, 1] (a float or an int 1), or a size with a unit as a string ("8GiB", "512MB")."""
    if isinstance(value, str):
        try:
            size = int(_BYTES.validate_python(value))
        except ValidationError:
            size = 0
        if size < 1 or not any(c.isalpha() for c in value):
            raise ValueError(f"expected a fraction of free memory in (0, 1] or a size with a unit such as '8GiB', got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"expected a fraction of free memory in (0, 1] or a size with a unit such as '8GiB', got {value!r}")
    return float(value)


#: batches a training stage may hold at once besides its data (the streaming reader's queue and the two in use)
BATCHES_IN_FLIGHT = 6

#: `TrainSettings.feed_memory`: a fraction of the training device's free memory, or a size ("8GiB")
Memory = Annotated[float | str, PlainValidator(_memory)]


def memory_bytes(memory: float | str, free: int) -> int:
    """The bytes `memory` (a `Memory` value) allows on a device with `free` bytes free."""
    return int(_BYTES.validate_python(memory)) if isinstance(memory, str) else int(memory * free)


@settings
class TrainSettings:
    """The loop's options, shared by every trained component (params.yaml `train:` for the sparse models, the
    `train:` blocks of `encoder` and `captions`).

    batch_size: rows per optimiser step. epochs: passes over the data (at least). min_steps: the run makes at least
    this many optimiser steps (whole epochs), so a small data set is trained to convergence. lr: peak learning rate
    (AdamW), or "auto" = 0.5 / sqrt(total steps) clipped to [5e-4, 1e-2] (`pipeline.training.schedule.plan`).
    weight_decay: decoupled weight decay on weight matrices (0 = Adam). warmup_frac: fraction of the steps of
    linear warm-up. min_lr_frac: the cosine decay ends at this fraction of lr. grad_clip: maximum global gradient
    norm (0 = no clipping). patience: epochs without validation improvement before stopping (components trained
    with a monitored validation only; a sparse model counts them only after its `min_steps`). init_samples: rows of the sample a sparse model's data-dependent
    initialisation sees (means, PCA, thresholds). val_samples: rows of the validation split a sparse model is
    validated on after each epoch (a seeded subsample, so validation memory does not grow with the dataset).
    max_steps: stop after this many optimiser steps in all (None: every batch of every epoch; it wins over
    min_steps); the schedule spans the steps the run makes, so a fixed budget of steps trains the same way on any
    dataset size. device: "auto" (cuda when present), "cpu", "cuda[:i]", "mps". precision: "bf16" runs the forward
    pass and the loss under bfloat16 autocast on a GPU (weights, optimiser state and gradients stay float32; no loss
    scaling is needed with bfloat16); it is ignored on the CPU and by modules that are not safe in bfloat16
    (`autocast_safe = False`: the rotation models, whose matrix exponential / Cayley map needs float32).
    feed: how a stage's training split reaches the steps (the training stage of the sparse models; components
    trained on in-memory arrays ignore it; `pipeline.training.feed`): "resident" reads the split once into memory on
    the training device and draws each epoch as a seeded full permutation, batches gathered there; "streaming" reads
    it from the store in a background thread pool, shuffled within windows of `shuffle_rows` rows (a weaker
    shuffle: another order than resident's); "auto" is resident when the split fits `feed_memory`, else streaming.
    The mode used is part of the training fingerprint. feed_memory: what the training data may hold on the training
    device: a fraction of its free memory when the stage starts (GPU memory on a GPU, available RAM on the CPU), or
    a size ("8GiB", "512MB"); streaming keeps its windows and batches in flight within it. shuffle_rows: rows of
    one streaming shuffle window (chunk order permuted per epoch, rows permuted within a window).
    Defaults: the published SAE settings (Adam, batch 256; lr 5e-4 at scale) with the budget rule for small data.
    """

    batch_size: PositiveInt = 256
    epochs: PositiveInt = 20
    min_steps: NonNegativeInt = 2000
    lr: PositiveOrAuto = "auto"
    weight_decay: NonNegativeFloat = 0.0
    warmup_frac: Fraction = 0.05
    min_lr_frac: Fraction = 0.1
    grad_clip: NonNegativeFloat = 1.0
    patience: PositiveInt = 3
    init_samples: PositiveInt = 20_000
    val_samples: PositiveInt = 20_000
    max_steps: PositiveInt | None = None
    device: Device = "auto"
    precision: Literal["fp32", "bf16"] = "fp32"
    feed: Literal["auto", "resident", "streaming"] = "auto"
    feed_memory: Memory = 0.5
    shuffle_rows: PositiveInt = 131_072


_LR = TypeAdapter(PositiveOrAuto)


def lr_axis(value: Any) -> tuple[float | str, ...]:
    """The learning rates a `train.lr` entry asks for: a list (a sparse model's learning-rate axis, params.yaml
    `methods.<m>.train.lr: [..]`; each candidate is trained and the best kept on the validation split,
    `pipeline.training.lr_axis`) or one value (an axis of one). Each must be a number > 0 or "auto"; a list must be
    non-empty, without repeats. ValueError with one line per problem, each starting with the item it names (`[i]: `,
    or `: ` for the entry as a whole)."""
    listed = isinstance(value, (list, tuple))
    if listed and not value:
        raise ValueError(": expected at least one learning rate, got an empty list")
    problems, values = [], []
    for i, item in enumerate(value if listed else [value]):
        try:
            values.append(_LR.validate_python(item))
        except ValidationError as e:
            problems.append(f"{f'[{i}]' if listed else ''}: {e.errors()[0]['msg'].removeprefix('Value error, ')}")
    repeated = sorted({str(v) for v in values if values.count(v) > 1})
    if repeated:
        problems.append(f": learning rates listed twice: {', '.join(repeated)}")
    if problems:
        raise ValueError("\n".join(problems))
    return tuple(values)
