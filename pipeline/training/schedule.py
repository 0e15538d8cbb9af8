"""The learning-rate schedule every training run uses: linear warm-up, then cosine decay to a floor."""

from __future__ import annotations

import math


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
