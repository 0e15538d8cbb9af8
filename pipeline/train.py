"""One training loop for every sparse model (CEDAR, rotation baselines, SAEs).

The loop knows nothing about files: batches come from a `BatchSource` (a function of the
epoch that yields float32 (b, d) arrays — from memory or streamed from a zarr store by
`pipeline.store`), and resumable state goes through two callbacks the stage provides.

Per step: `loss, stats = model.training_loss(x, progress, gen)`, backward, gradient clipping,
`model.before_step()`, optimiser step, `model.after_step()`, learning-rate schedule (linear
warm-up then cosine decay to `min_lr_frac * lr`). After each epoch the validation FVU at the
model's own k decides early stopping; the best epoch's weights are restored at the end.
Epoch order depends only on (seed, epoch), so a run resumed from an epoch checkpoint gives
the same numbers as an uninterrupted one.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from pipeline.models.base import SparseModel

log = logging.getLogger(__name__)

#: epoch -> iterator of float32 (batch, d) arrays covering the training split once.
BatchSource = Callable[[int], Iterator[np.ndarray]]


@dataclass
class TrainSettings:
    """Settings of the loop shared by all methods (params.yaml `train:`, per-method overrides allowed).

    Defaults follow the published SAE settings (Adam, lr 5e-4, batch 256) scaled for short runs.
    """

    batch_size: int = 256
    epochs: int = 20
    lr: float = 5e-4
    warmup_frac: float = 0.05
    min_lr_frac: float = 0.1
    grad_clip: float = 1.0
    patience: int = 3
    val_fraction: float = 0.1
    init_samples: int = 20_000
    seed: int = 0
    device: str = "auto"


@dataclass
class TrainState:
    """What an epoch checkpoint holds besides the model and optimiser tensors."""

    epoch: int = 0
    step: int = 0
    best_fvu: float = math.inf
    best_epoch: int = -1
    bad_epochs: int = 0
    history: list[dict[str, float]] = field(default_factory=list)


@dataclass
class TrainResult:
    model: SparseModel
    history: list[dict[str, float]]
    best_epoch: int
    stopped_early: bool


def resolve_device(device: str) -> torch.device:
    """'auto' -> cuda when present, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def array_batches(x: np.ndarray, batch_size: int, seed: int) -> BatchSource:
    """Shuffled mini-batches of an in-memory array; the order depends only on (seed, epoch)."""

    def batches(epoch: int) -> Iterator[np.ndarray]:
        order = np.random.default_rng([seed, epoch]).permutation(len(x))
        for start in range(0, len(order), batch_size):
            yield x[order[start : start + batch_size]]

    return batches


def lr_factor(step: int, total: int, warmup_frac: float, min_lr_frac: float) -> float:
    """Multiplier of the base learning rate: linear warm-up, then cosine decay to min_lr_frac."""
    warmup = max(1, int(round(warmup_frac * total)))
    if step < warmup:
        return (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr_frac + (1.0 - min_lr_frac) * 0.5 * (1.0 + math.cos(math.pi * t))


@torch.no_grad()
def validate(model: SparseModel, x_val: torch.Tensor, batch_size: int = 4096) -> dict[str, float]:
    """FVU (float64, dataset level), mean L0 and dead fraction of `model` at its own k on x_val."""
    model.eval()
    sse = 0.0
    ever_active = torch.zeros(model.n_latents, dtype=torch.bool, device=x_val.device)
    l0 = 0.0
    for start in range(0, len(x_val), batch_size):
        xb = x_val[start : start + batch_size]
        codes = model.encode(xb)
        sse += float(((model.decode(codes) - xb).double() ** 2).sum())
        active = codes != 0
        l0 += float(active.sum())
        ever_active |= active.any(0)
    centred = float(((x_val.double() - x_val.double().mean(0)) ** 2).sum())
    model.train()
    n = len(x_val)
    return {
        "val_fvu": sse / max(centred, 1e-30),
        "val_l0": l0 / n,
        "val_dead_fraction": float((~ever_active).float().mean()),
    }


def fit(
    model: SparseModel,
    batches: BatchSource,
    steps_per_epoch: int,
    init_sample: np.ndarray,
    x_val: np.ndarray,
    settings: TrainSettings,
    save_state: Callable[[SparseModel, torch.optim.Optimizer, TrainState, dict[str, torch.Tensor]], None] | None = None,
    load_state: Callable[[SparseModel, torch.optim.Optimizer], tuple[TrainState, dict[str, torch.Tensor]] | None] | None = None,
) -> TrainResult:
    """Train `model` in place and return it with its per-epoch history.

    init_sample: float (m, d) training rows for `fit_init` (means, PCA, thresholds).
    x_val: float (n_val, d) validation rows for early stopping (held in memory).
    save_state/load_state: optional epoch-checkpoint callbacks. `save_state(model, optimizer,
    state, best_weights)` runs after every epoch; `load_state(model, optimizer)` restores model and
    optimiser in place and returns (state, best_weights) to resume after that epoch, or None.
    """
    device = resolve_device(settings.device)
    torch.manual_seed(settings.seed)
    model.to(device)
    model.fit_init(torch.as_tensor(init_sample, dtype=torch.float32, device=device))
    x_val_t = torch.as_tensor(x_val, dtype=torch.float32, device=device)
    if not model.trainable:
        metrics = validate(model, x_val_t)
        log.info("%s: no training needed (val FVU %.4f)", model.method, metrics["val_fvu"])
        return TrainResult(model.eval(), [{"epoch": 0, **metrics}], 0, False)

    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    total = max(1, settings.epochs * steps_per_epoch)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, total, settings.warmup_frac, settings.min_lr_frac)
    )
    best_weights = copy.deepcopy(model.state_dict())
    resumed = load_state(model, optimizer) if load_state else None
    state = TrainState()
    if resumed is not None:
        state, best_weights = resumed
        log.info("%s: resuming after epoch %d", model.method, state.epoch)
        for group in optimizer.param_groups:
            group["lr"] = settings.lr * lr_factor(state.step, total, settings.warmup_frac, settings.min_lr_frac)
        schedule.last_epoch = state.step
    generator = torch.Generator(device=device)
    stopped_early = False
    model.train()
    for epoch in range(state.epoch, settings.epochs):
        generator.manual_seed(settings.seed * 1_000_003 + epoch)
        sums: dict[str, torch.Tensor] = {}  # summed on the device; read back only for display
        n_batches = 0
        bar = tqdm(batches(epoch), total=steps_per_epoch, desc=f"{model.method} epoch {epoch + 1}/{settings.epochs}", leave=False)
        for xb in bar:
            x = torch.as_tensor(xb, dtype=torch.float32, device=device)
            loss, stats = model.training_loss(x, min(1.0, state.step / total), generator)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{model.method}: loss became {float(loss)} at epoch {epoch + 1}, step {state.step}; lower train.lr")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if settings.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
            model.before_step()
            optimizer.step()
            model.after_step()
            schedule.step()
            state.step += 1
            n_batches += 1
            for name, value in {"loss": loss, **stats}.items():
                sums[name] = sums.get(name, 0.0) + torch.as_tensor(value).detach().float()
            if n_batches % 20 == 1:
                bar.set_postfix({name: f"{float(value) / n_batches:.4g}" for name, value in sums.items()})
        record = {"epoch": epoch + 1, **{f"train_{k}": float(v) / max(n_batches, 1) for k, v in sums.items()}, **validate(model, x_val_t)}
        state.history.append(record)
        state.epoch = epoch + 1
        log.info("%s epoch %d: %s", model.method, epoch + 1, ", ".join(f"{k}={v:.4g}" for k, v in record.items() if k != "epoch"))
        if record["val_fvu"] < state.best_fvu - 1e-6 and model.acceptable(record["val_l0"]):
            state.best_fvu, state.best_epoch, state.bad_epochs = record["val_fvu"], epoch + 1, 0
            best_weights = copy.deepcopy(model.state_dict())
        elif state.step / total >= getattr(model, "curriculum_end", 0.0):
            # patience counts only once a curriculum (CEDAR's dense-to-sparse k) has reached its target:
            # before that, validation at the target k need not improve from epoch to epoch.
            state.bad_epochs += 1
        if save_state:
            save_state(model, optimizer, state, best_weights)
        if state.bad_epochs >= settings.patience:
            stopped_early = True
            log.info("%s: early stop after epoch %d (best %d)", model.method, epoch + 1, state.best_epoch)
            break
    if state.best_epoch > 0 and state.best_epoch != state.epoch:
        model.load_state_dict(best_weights)
    elif state.best_epoch < 0:
        log.warning("%s: no epoch met the model's sparsity target; keeping the last one", model.method)
    return TrainResult(model.eval(), state.history, state.best_epoch, stopped_early)


def fit_array(model: SparseModel, x: np.ndarray, settings: TrainSettings) -> TrainResult:
    """Train on an in-memory float array (n, d): a seeded validation split, the same loop as the stages."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != model.d:
        raise ValueError(f"fit_array: expected x of shape (n, {model.d}), got {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("fit_array: x contains NaN or infinite values")
    order = np.random.default_rng(settings.seed).permutation(len(x))
    n_val = max(1, int(round(settings.val_fraction * len(x))))
    if len(x) - n_val < 2:
        raise ValueError(f"fit_array: need at least {n_val + 2} rows for a validation split, got {len(x)}")
    val, train = x[order[:n_val]], x[order[n_val:]]
    steps = math.ceil(len(train) / settings.batch_size)
    return fit(model, array_batches(train, settings.batch_size, settings.seed), steps, train[: settings.init_samples], val, settings)


def split_settings(options: dict[str, Any]) -> tuple[dict[str, Any], TrainSettings]:
    """Split a flat dict of keyword options into (model options, TrainSettings) for the `fit` conveniences."""
    names = {f for f in TrainSettings.__dataclass_fields__}
    settings = TrainSettings(**{k: v for k, v in options.items() if k in names})
    return {k: v for k, v in options.items() if k not in names}, settings


def settings_dict(settings: TrainSettings) -> dict[str, Any]:
    return asdict(settings)
