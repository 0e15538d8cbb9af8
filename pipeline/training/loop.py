"""One training loop for everything the pipeline trains: the sparse models, the embedded encoder, the caption decoder.

The loop knows nothing about files or about what it trains. It needs

- a module (`Trainable`) with `training_loss(batch, progress, generator) -> (loss, stats)` and two hooks,
  `before_step()` (after backward, before the optimiser step: e.g. project decoder gradients) and
  `after_step()` (e.g. renormalise a dictionary, clamp a temperature);
- a `BatchSource`: a function of the epoch that yields the batches of one pass over the data (whatever
  `training_loss` takes: an array, a tuple of tensors), in an order that depends only on (seed, epoch), so a
  run resumed after a kill sees exactly the batches an uninterrupted run would;
- `TrainSettings`, the loop's options (params.yaml `train:`, and the `train:` block of every trained
  component).

Per step: `loss, stats = module.training_loss(batch, progress, generator)`, backward, gradient-norm clipping,
`before_step()`, AdamW step (weight decay on weight matrices only; with `weight_decay = 0` it is Adam), `after_step()`,
then the learning-rate schedule (`pipeline.training.schedule.lr_factor`: linear warm-up, cosine decay to
`min_lr_frac * lr`). On a GPU, host batches are copied from pinned host memory one batch ahead (`prefetched`; batches
already on the device, as `array_batches` gathers from a device tensor, pass through), no step waits for the device
(the non-finite-loss check reads a flag copied back 20 steps earlier; the statistics stay on the device until the
epoch ends), and `precision: bf16` runs the forward pass and the loss under bfloat16 autocast where the module allows it. `progress` in [0, 1] is the fraction of planned steps done (it drives curricula such as
CEDAR's dense-to-sparse k without the module knowing the loop); `generator` is seeded per epoch for any
randomness inside the loss.

After each epoch an optional `Validation` runs. With a `monitor` key (lower is better) the loop keeps the best
epoch's weights, stops after `patience` epochs without improvement and restores the best epoch at the end;
`accept(record)` can refuse an epoch as "best" (e.g. an SAE denser than its target L0) and `patience_from` makes
early epochs not count (before a curriculum has reached its target the monitored value need not improve).
Epoch checkpoints go through two callbacks (`save_state`, `load_state`, see `pipeline.training.resume`).
The result carries the wall-clock seconds of the steps, the validations and the checkpoints (`TrainResult.timings`;
never in the history, which must be the same from run to run).
The global torch RNG is left as it was: the loop seeds a forked RNG with `seed` (dropout, sampling).
"""

from __future__ import annotations

import copy
import importlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from pipeline.training.device import host_to_device, resolve_device
from pipeline.training.options import TrainSettings
from pipeline.training.schedule import lr_factor, plan

log = logging.getLogger(__name__)

#: epoch -> iterator of batches covering the training data once (the order depends only on the seed and the epoch)
BatchSource = Callable[[int], Iterator[Any]]




class Trainable(Protocol):
    """What the loop drives: an `nn.Module` with a loss and two step hooks."""

    def training_loss(self, batch: Any, progress: float, generator: torch.Generator) -> tuple[Tensor, dict[str, Tensor]]:
        """Scalar loss of one batch and named detached statistics (averaged per epoch into the history)."""
        ...

    def before_step(self) -> None: ...

    def after_step(self) -> None: ...


@dataclass(frozen=True)
class Validation:
    """Per-epoch validation: `run()` returns named numbers added to the epoch's history record.

    monitor: the key whose lowest value marks the best epoch (None: keep the last epoch, no early stopping).
    accept: whether an epoch's record may become the best one. patience_from: training progress after which
    epochs without improvement count towards `TrainSettings.patience`.
    """

    run: Callable[[], dict[str, float]]
    monitor: str | None = None
    accept: Callable[[dict[str, float]], bool] = lambda record: True
    patience_from: float = 0.0


@dataclass
class TrainState:
    """What an epoch checkpoint holds besides the module and optimiser tensors."""

    epoch: int = 0
    step: int = 0
    best_value: float = float("inf")
    best_epoch: int = -1
    bad_epochs: int = 0
    history: list[dict[str, float]] = field(default_factory=list)


@dataclass
class TrainResult:
    """The trained module (eval mode) and its per-epoch history; best_epoch is 1-based (-1: none was accepted).
    timings: wall-clock seconds of this run's "steps", "validation" and "checkpoint" (and "steps_run", the steps it
    made: fewer than the budget after a resume)."""

    module: nn.Module
    history: list[dict[str, float]]
    best_epoch: int
    stopped_early: bool
    timings: dict[str, float] = field(default_factory=dict)


SaveState = Callable[[nn.Module, torch.optim.Optimizer, TrainState, dict[str, Tensor]], None]
LoadState = Callable[[nn.Module, torch.optim.Optimizer], "tuple[TrainState, dict[str, Tensor]] | None"]


def to_device(batch: Any, device: torch.device) -> Any:
    """A batch on `device`: numpy float arrays become float32 tensors, other arrays keep their dtype; tuples and
    lists are converted element by element. To a GPU, host memory is pinned and the copy is non-blocking."""
    if isinstance(batch, Tensor):
        if device.type == "cuda" and batch.device.type == "cpu":
            return batch.pin_memory().to(device, non_blocking=True)
        return batch.to(device, non_blocking=True)
    if isinstance(batch, np.ndarray):
        return host_to_device(batch, device)
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(part, device) for part in batch)
    raise TypeError(f"batch: expected a tensor, a numpy array or a tuple of them, got {type(batch).__name__}")


def prefetched(batches: Iterator[Any], device: torch.device) -> Iterator[Any]:
    """The batches on `device`, one ahead: the next batch is read (from memory or a store) and its copy to the
    device issued before the current one is handed out, so on a GPU the transfer overlaps the current step."""
    source = iter(batches)
    pending = next(source, None)
    ready = to_device(pending, device) if pending is not None else None
    while ready is not None:
        current = ready
        pending = next(source, None)
        ready = to_device(pending, device) if pending is not None else None
        yield current


def use_bf16(module: nn.Module, settings: TrainSettings, device: torch.device) -> bool:
    """Whether this module trains under bfloat16 autocast: asked for, on a GPU, and safe for the module."""
    if settings.precision != "bf16":
        return False
    if device.type != "cuda" or not getattr(module, "autocast_safe", True):
        log.info("%s: precision bf16 ignored (%s); training in float32", type(module).__name__,
                 "not on a GPU" if device.type != "cuda" else "the module is not safe in bfloat16")
        return False
    return True


def preload_optimizer() -> threading.Thread:
    """Start importing, in a background thread, what the first optimiser of a process imports (torch's optimisers
    import torch._dynamo on first use: 1-4 s here), so that a stage does it while it reads its data. Joined by
    nothing: the optimiser's own import waits for it if it is still running."""
    thread = threading.Thread(target=importlib.import_module, args=("torch._dynamo",), name="preload-optimizer", daemon=True)
    thread.start()
    return thread


def make_optimizer(module: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW with weight decay on parameters of two or more dimensions only (biases, gains, scalars undecayed)."""
    params = [p for p in module.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr)


def fit(
    module: nn.Module,
    batches: BatchSource,
    steps_per_epoch: int,
    settings: TrainSettings,
    seed: int,
    validation: Validation | None = None,
    save_state: SaveState | None = None,
    load_state: LoadState | None = None,
    name: str = "",
) -> TrainResult:
    """Train `module` (a `Trainable`) in place on `settings.device`; returns it in eval mode with its history.

    steps_per_epoch: batches `batches(epoch)` yields (sizes the schedule). seed: seeds the forked torch RNG and the
    per-epoch generators. save_state(module, optimizer, state, best_weights) runs after every epoch;
    load_state(module, optimizer) restores both in place and returns (state, best_weights) to resume after that
    epoch, or None (it is not called after the last epoch).
    """
    name = name or type(module).__name__
    device = resolve_device(settings.device)
    module.to(device)
    budget = plan(settings.epochs, settings.min_steps, settings.max_steps, settings.lr, steps_per_epoch)
    epochs, total, lr = budget.epochs, budget.steps, budget.lr
    optimizer = make_optimizer(module, lr, settings.weight_decay)
    bf16 = use_bf16(module, settings, device)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total, settings.warmup_frac, settings.min_lr_frac))
    best_weights = copy.deepcopy(module.state_dict())
    state = TrainState()
    resumed = load_state(module, optimizer) if load_state else None
    if resumed is not None:
        state, best_weights = resumed
        log.info("%s: resuming after epoch %d", name, state.epoch)
        for group in optimizer.param_groups:
            group["lr"] = lr * lr_factor(state.step, total, settings.warmup_frac, settings.min_lr_frac)
        schedule.last_epoch = state.step
    monitor = validation.monitor if validation is not None else None
    stopped_early = False
    timings = {"steps": 0.0, "validation": 0.0, "checkpoint": 0.0, "steps_run": 0.0}
    first_step = state.step
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        generator = torch.Generator(device=device)
        module.train()
        for epoch in range(state.epoch, epochs):
            generator.manual_seed(seed * 1_000_003 + epoch)
            clock = time.perf_counter()
            record = _epoch(module, batches(epoch), steps_per_epoch, optimizer, schedule, settings, state, total, generator, device,
                            f"{name} epoch {epoch + 1}/{epochs}", bf16)  # ends by reading its statistics back: the device is done
            timings["steps"] += time.perf_counter() - clock
            if validation is not None:
                clock = time.perf_counter()
                module.eval()
                with torch.no_grad():
                    record.update(validation.run())
                module.train()
                timings["validation"] += time.perf_counter() - clock
            record = {"epoch": epoch + 1, **record}
            state.history.append(record)
            state.epoch = epoch + 1
            log.info("%s epoch %d: %s", name, epoch + 1, ", ".join(f"{k}={v:.4g}" for k, v in record.items() if k != "epoch"))
            if monitor is not None:
                assert validation is not None
                if record[monitor] < state.best_value - 1e-6 and validation.accept(record):
                    state.best_value, state.best_epoch, state.bad_epochs = record[monitor], epoch + 1, 0
                    best_weights = copy.deepcopy(module.state_dict())
                elif state.step / total >= validation.patience_from:
                    state.bad_epochs += 1
            stopped_early = monitor is not None and state.bad_epochs >= settings.patience
            if save_state and not stopped_early and state.step < total and epoch + 1 < epochs:
                # (none after the last epoch: the caller saves the result at once, and a run killed before that
                # resumes from the epoch before and recomputes the same last epoch)
                clock = time.perf_counter()
                save_state(module, optimizer, state, best_weights)
                timings["checkpoint"] += time.perf_counter() - clock
            if stopped_early:
                log.info("%s: early stop after epoch %d (best %d)", name, epoch + 1, state.best_epoch)
                break
            if state.step >= total:
                log.info("%s: step budget of %d steps reached in epoch %d", name, total, epoch + 1)
                break
    if monitor is None:
        state.best_epoch = state.epoch
    elif state.best_epoch > 0 and state.best_epoch != state.epoch:
        module.load_state_dict(best_weights)
    elif state.best_epoch < 0:
        log.warning("%s: no epoch was accepted by its validation; keeping the last one", name)
    timings["steps_run"] = float(state.step - first_step)
    return TrainResult(module.eval(), state.history, state.best_epoch, stopped_early, timings)


def _epoch(module: nn.Module, batches: Iterator[Any], steps: int, optimizer: torch.optim.Optimizer, schedule: Any,
           settings: TrainSettings, state: TrainState, total: int, generator: torch.Generator, device: torch.device,
           desc: str, bf16: bool = False) -> dict[str, float]:
    """One pass over `batches` (or up to the step budget `total`); returns the epoch means of the loss and stats
    ("train_<name>") and the last lr."""
    sums: dict[str, Tensor] = {}  # summed on the device; read back once per epoch (and for a progress bar on a terminal)
    n_batches = 0
    finite = torch.ones((), dtype=torch.bool, device=device)  # all losses so far finite (kept on the device)
    check = FiniteCheck(device)
    bar = tqdm(prefetched(batches, device), total=min(steps, total - state.step), desc=desc, leave=False, disable=None)
    for batch in bar:
        if state.step >= total:
            break
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, stats = module.training_loss(batch, min(1.0, state.step / total), generator)  # type: ignore[operator]
        finite &= torch.isfinite(loss.detach())
        if not check(finite, state.step):
            raise FloatingPointError(f"{desc}: loss became non-finite by step {state.step}; lower the learning rate")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if settings.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(module.parameters(), settings.grad_clip)
        module.before_step()  # type: ignore[operator]
        optimizer.step()
        module.after_step()  # type: ignore[operator]
        schedule.step()
        state.step += 1
        n_batches += 1
        for key, value in {"loss": loss, **stats}.items():
            sums[key] = sums.get(key, 0.0) + torch.as_tensor(value).detach().float()
        if n_batches % 20 == 1 and not bar.disable:  # reading the sums back waits for the device: only for a visible bar
            bar.set_postfix({key: f"{float(value) / n_batches:.4g}" for key, value in sums.items()})
    if not bool(finite):
        raise FloatingPointError(f"{desc}: loss became non-finite by step {state.step}; lower the learning rate")
    record = {f"train_{key}": float(value) / max(n_batches, 1) for key, value in sums.items()}
    record["lr"] = float(optimizer.param_groups[0]["lr"])
    return record


class FiniteCheck:
    """Whether every loss so far was finite, from a flag kept on the device (`finite`, a bool tensor). On the CPU it
    is read every step; on a GPU every `every` steps it is copied to page-locked host memory without waiting, and
    the copy made `every` steps earlier is read then (long finished), so no step waits for the device. A non-finite
    loss is thus reported at most 2 x `every` steps late on a GPU, and the epoch's end reads the flag itself."""

    def __init__(self, device: torch.device, every: int = 20) -> None:
        self.every = every
        self.gpu = device.type == "cuda"
        self.host = torch.ones((), dtype=torch.bool).pin_memory() if self.gpu else None
        self.copied: Any = None

    def __call__(self, finite: Tensor, step: int) -> bool:
        if not self.gpu:
            return bool(finite)
        if step % self.every:
            return True
        ok = True
        if self.copied is not None:
            self.copied.synchronize()  # recorded `every` steps ago: already complete
            ok = bool(self.host)
        self.host.copy_(finite, non_blocking=True)  # type: ignore[union-attr]
        self.copied = torch.cuda.Event()
        self.copied.record()
        return ok


def array_batches(x: np.ndarray | Tensor, batch_size: int, seed: int) -> BatchSource:
    """Shuffled mini-batches of in-memory rows x (n, ...), a numpy array or a tensor on any device: each epoch is a
    full permutation drawn by numpy's generator seeded by (seed, epoch), cut into batches of `batch_size` (the last
    one shorter), each batch's rows taken in ascending row order (the same set of rows, read in storage order: a
    gather about twice as fast on the CPU). Every device gets the same batches; a tensor's batches are index gathers
    on its device (the epoch's indices are copied there once)."""

    def batches(epoch: int) -> Iterator[Any]:
        order = np.random.default_rng([seed, epoch]).permutation(len(x))
        n_full = len(order) // batch_size * batch_size
        order[:n_full] = np.sort(order[:n_full].reshape(-1, batch_size), axis=1).reshape(-1)
        order[n_full:] = np.sort(order[n_full:])
        if isinstance(x, Tensor):
            index = torch.from_numpy(order)
            index = index.pin_memory().to(x.device, non_blocking=True) if x.device.type == "cuda" else index.to(x.device)
            for start in range(0, len(order), batch_size):
                yield x.index_select(0, index[start : start + batch_size])
            return
        for start in range(0, len(order), batch_size):
            yield x[order[start : start + batch_size]]

    return batches
