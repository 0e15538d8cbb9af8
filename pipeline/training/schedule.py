"""How long and how fast every training run goes: the step budget, the learning rate, and its schedule.

The budget rule (`plan`): a run makes max(epochs x steps per epoch, min_steps) optimiser steps, rounded up to whole
epochs (or `max_steps`, when set and smaller), so a small data set is not left under-trained by an epoch count meant for millions of rows; with
`lr: auto` the peak learning rate is 0.5 / sqrt(total steps), clipped to [5e-4, 1e-2]. Adam moves each weight by
about lr per step, so a short run needs a larger step and a long one a smaller: 2,000 steps give 1e-2, and the
published SAE rate 5e-4 is reached at a million steps (about 200 ImageNet epochs at batch 256). Measured on planted
data (d = 32, k = 4, 8,000 rows, dictionary 2d, noise 0.1): with this rule every SAE but ReLU ends within 2x of
the oracle FVU (top-k in the true basis), where the old defaults (lr 5e-4, 20 epochs = 460 steps) ended 18-22x
above it (bench/bench_training_budget.py). The `min_steps` are guaranteed: a sparse model's early stopping counts
epochs only after them (`Plan.guaranteed`), so a small data set is trained through the whole learning-rate decay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def lr_factor(step: int, total: int, warmup_frac: float, min_lr_frac: float) -> float:
    """Multiplier of the base learning rate at optimiser step `step` of `total`.

    Linear warm-up over round(warmup_frac * total) steps (at least one), then a half cosine from 1 down to
    `min_lr_frac` at `total` (and flat after it).
    """
    warmup = max(1, int(round(warmup_frac * total)))
    if step < warmup:
        return (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr_frac + (1.0 - min_lr_frac) * 0.5 * (1.0 + math.cos(math.pi * t))


#: the automatic learning rate: LR_SCALE / sqrt(total steps), clipped to [LR_MIN, LR_MAX]
LR_SCALE, LR_MIN, LR_MAX = 0.5, 5e-4, 1e-2


@dataclass(frozen=True)
class Plan:
    """A run's budget: `epochs` started (the last one may stop at `steps`), `steps` optimiser steps in all (what the
    learning-rate schedule spans), peak learning rate `lr`, and `guaranteed`, the fraction of `steps` the `min_steps`
    rule asked for (1 when the run is no longer than that: a sparse model's early stopping counts only after it,
    `pipeline.training.sparse.train_sparse`)."""

    epochs: int
    steps: int
    lr: float
    guaranteed: float = 0.0


def plan(epochs: int, min_steps: int, max_steps: int | None, lr: float | str, steps_per_epoch: int) -> Plan:
    """The budget by the rule of the module docstring; a `max_steps` cap wins over `min_steps`."""
    steps_per_epoch = max(1, steps_per_epoch)
    epochs = max(epochs, math.ceil(min_steps / steps_per_epoch))
    steps = epochs * steps_per_epoch
    if max_steps is not None and max_steps < steps:
        steps, epochs = max_steps, math.ceil(max_steps / steps_per_epoch)
    if lr == "auto":
        lr = min(LR_MAX, max(LR_MIN, LR_SCALE / math.sqrt(steps)))
    return Plan(epochs, steps, float(lr), min(1.0, min_steps / steps))
