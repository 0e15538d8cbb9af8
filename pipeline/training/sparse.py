"""Training a sparse model (CEDAR, a rotation baseline, an SAE) with the one loop, and the quick `fit` helpers.

`train_sparse` is what the training stage and the helpers below run: the data-dependent initialisation
(`model.fit_init` on a sample of training rows), then `pipeline.training.loop.fit` with a per-epoch validation of
FVU, mean L0 and dead-latent fraction at the model's own k on held-out rows. The epoch of lowest validation FVU
that the model accepts is kept (ReLU and JumpReLU refuse epochs denser than their target L0, `model.acceptable`),
and epochs without improvement count towards `patience` only once a curriculum (CEDAR's dense-to-sparse k) or the
resampling of an SAE's latents is over (`model.curriculum_end`) and the run is past its guaranteed `min_steps`
(`pipeline.training.schedule.Plan.guaranteed`): on small data the budget rule's steps are all trained, down to the
end of the learning-rate decay, where the last of the FVU is won (CEDAR on planted data, noise 0.01: 2.2x the oracle
when early stopping cut the decay short, 1.7x with it). Models with nothing to learn (the fixed rotation bases) are
initialised and validated once.

Quick helpers on in-memory arrays, the same path as the stages (for notebooks and benchmarks):
`fit_array(model, x, settings, seed)` (a seeded validation split), `fit_sae(x, method, dict_size, k, seed,
**options)` and `fit_cedar(x, k, seed, **options)`, where options mixes the model's options and `TrainSettings`
fields in one flat namespace.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any

import numpy as np
import torch

from pipeline.models.base import SparseModel
from pipeline.models.options import OPTIONS, ROTATION_METHODS, options_class
from pipeline.models.registry import build
from pipeline.training.device import resolve_device
from pipeline.training.loop import BatchSource, LoadState, SaveState, TrainResult, Validation, array_batches, fit
from pipeline.training.options import TrainSettings
from pipeline.training.schedule import plan

log = logging.getLogger(__name__)

@torch.no_grad()
def validate(model: SparseModel, x_val: torch.Tensor, batch_size: int = 4096, centred: float | None = None) -> dict[str, float]:
    """FVU (float64, dataset level), mean L0 and dead fraction of `model` at its own k on x_val (n_val, d). The sums
    stay on x_val's device and are read back once; squares are summed in float64 without a float64 copy of the
    rows (`vector_norm`'s own accumulation). centred: x_val's total squared deviation from its mean
    (`centred_sum_of_squares`), computed here when not given (a loop validating every epoch passes it once)."""
    sse = torch.zeros((), dtype=torch.float64, device=x_val.device)
    l0 = torch.zeros((), dtype=torch.float64, device=x_val.device)
    ever_active = torch.zeros(model.n_latents, dtype=torch.bool, device=x_val.device)
    for start in range(0, len(x_val), batch_size):
        xb = x_val[start : start + batch_size]
        codes = model.encode(xb)
        sse += torch.linalg.vector_norm(model.decode(codes) - xb, dtype=torch.float64) ** 2
        active = codes != 0
        l0 += active.sum()
        ever_active |= active.any(0)
    centred = centred_sum_of_squares(x_val) if centred is None else centred
    sse_, l0_, dead = torch.stack([sse, l0, (~ever_active).double().mean()]).tolist()
    return {"val_fvu": sse_ / max(centred, 1e-30), "val_l0": l0_ / len(x_val), "val_dead_fraction": dead}


@torch.no_grad()
def centred_sum_of_squares(x: torch.Tensor, batch_size: int = 4096) -> float:
    """sum over rows and columns of (x - column mean)^2, in float64 (block by block, without a float64 copy of x):
    the denominator of the dataset-level FVU."""
    mean = x.mean(0, dtype=torch.float64)
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, len(x), batch_size):
        total += torch.linalg.vector_norm(x[start : start + batch_size] - mean, dtype=torch.float64) ** 2
    return float(total)


def train_sparse(
    model: SparseModel,
    batches: BatchSource,
    steps_per_epoch: int,
    init_sample: np.ndarray | torch.Tensor,
    x_val: np.ndarray | torch.Tensor,
    settings: TrainSettings,
    seed: int,
    save_state: SaveState | None = None,
    load_state: LoadState | None = None,
) -> TrainResult:
    """Initialise `model` from init_sample (m, d) and train it; validation on x_val (n_val, d) picks the epoch kept.
    Arrays or tensors (on any device: they are moved to the training device). The result's timings add "init" and
    "finish" (seconds of the initialisation and of the post-training correction) to the loop's."""
    device = resolve_device(settings.device)
    clock = time.perf_counter()
    model.to(device)
    init = torch.as_tensor(init_sample, dtype=torch.float32, device=device)
    model.fit_init(init)
    x_val_t = torch.as_tensor(x_val, dtype=torch.float32, device=device)
    init_seconds = time.perf_counter() - clock
    if not model.trainable:
        model.eval()
        clock = time.perf_counter()
        record = {"epoch": 0, **validate(model, x_val_t)}
        log.info("%s: no training needed (val FVU %.4f)", model.method, record["val_fvu"])
        return TrainResult(model, [record], 0, False, {"init": init_seconds, "validation": time.perf_counter() - clock})
    centred = centred_sum_of_squares(x_val_t)
    budget = plan(settings.epochs, settings.min_steps, settings.max_steps, settings.lr, steps_per_epoch)
    validation = Validation(run=lambda: validate(model, x_val_t, centred=centred), monitor="val_fvu",
                            accept=lambda record: model.acceptable(record["val_l0"]),
                            patience_from=max(model.curriculum_end, budget.guaranteed))
    result = fit(model, batches, steps_per_epoch, settings, seed, validation, save_state, load_state, name=model.method)
    if result.best_epoch < 0:
        log.warning("%s: no epoch met the model's sparsity target; keeping the last one", model.method)
    clock = time.perf_counter()
    model.finish(init)
    result.timings.update(init=init_seconds, finish=time.perf_counter() - clock)
    return result


def fit_array(model: SparseModel, x: np.ndarray, settings: TrainSettings, seed: int = 0, val_fraction: float = 0.1) -> TrainResult:
    """Train on an in-memory float array (n, d): a seeded validation split of `val_fraction`, the loop of the stages."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != model.d:
        raise ValueError(f"fit_array: expected x of shape (n, {model.d}), got {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("fit_array: x contains NaN or infinite values")
    order = np.random.default_rng(seed).permutation(len(x))
    n_val = max(1, int(round(val_fraction * len(x))))
    if len(x) - n_val < 2:
        raise ValueError(f"fit_array: need at least {n_val + 2} rows for a validation split, got {len(x)}")
    val, train = x[order[:n_val]], x[order[n_val:]]
    steps = math.ceil(len(train) / settings.batch_size)
    return train_sparse(model, array_batches(train, settings.batch_size, seed), steps, train[: settings.init_samples], val, settings, seed)


def split_options(method: str, options: dict[str, Any], caller: str) -> tuple[dict[str, Any], TrainSettings]:
    """Split a flat namespace of keyword options into (the method's model options, TrainSettings); unknown keys fail."""
    model_keys = {f.name for f in dataclasses.fields(options_class(method))}
    train_keys = {f.name for f in dataclasses.fields(TrainSettings)}
    unknown = sorted(set(options) - model_keys - train_keys)
    if unknown:
        raise ValueError(f"{caller}: unknown options {unknown} for {method}; known: {sorted(model_keys | train_keys)}")
    return ({k: v for k, v in options.items() if k in model_keys},
            TrainSettings(**{k: v for k, v in options.items() if k in train_keys}))


def _check_x(x: np.ndarray, caller: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"{caller}: x must be a non-empty 2-D array (n, d), got shape {x.shape}")
    return x


def fit_sae(x: np.ndarray, method: str, dict_size: int, k: int, seed: int = 0, **options: Any) -> SparseModel:
    """Train an SAE of `method` on an in-memory float array x (n, d); returns it in eval mode.

    `options` takes the method's options and `TrainSettings` fields (epochs, lr, batch_size, ...) in one flat
    namespace; `seed` seeds both the initial weights and the loop.
    """
    if method not in OPTIONS or method in ROTATION_METHODS:
        raise ValueError(f"fit_sae: method must be one of {sorted(set(OPTIONS) - ROTATION_METHODS)}, got {method!r}")
    x = _check_x(x, "fit_sae")
    model_options, settings = split_options(method, options, "fit_sae")
    model = build(method, d=x.shape[1], dict_size=dict_size, k=k, seed=seed, **model_options)
    return fit_array(model, x, settings, seed).module  # type: ignore[return-value]


def fit_cedar(x: np.ndarray, k: int, seed: int = 0, **options: Any) -> SparseModel:
    """Train a CEDAR rotation on an in-memory float array x (n, d); returns it in eval mode.

    `options` takes Cedar options (parametrization, curriculum_frac, ...) and `TrainSettings` fields in one flat
    namespace (defaults: the budget rule of `pipeline.training.schedule`, as for every model). Early-stopping
    patience counts only once the curriculum has reached the target k.
    """
    x = _check_x(x, "fit_cedar")
    model_options, settings = split_options("cedar", options, "fit_cedar")
    model = build("cedar", d=x.shape[1], dict_size=x.shape[1], k=k, seed=seed, **model_options)
    return fit_array(model, x, settings, seed).module  # type: ignore[return-value]
