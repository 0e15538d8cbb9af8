"""Epoch checkpoints of a training run (`pipeline.training.loop.fit`'s save_state/load_state), so a killed run resumes.

Everything is safetensors (model, optimiser tensors, best weights) plus JSON (loop state, the
optimiser's param groups and the digest of the safetensors file): no pickle. Each file is written to a
temporary sibling and renamed, the JSON last, so a kill during the write leaves a pair that either matches or
is recognised as not matching. An epoch checkpoint that is damaged, or whose two files do not belong together,
is discarded with a warning and training starts from the beginning: it never blocks a rerun. The best epoch's
weights are stored only when they differ from the model's (an epoch that is the best so far stores one copy).

`Checkpoints` writes them in a background thread: `save` takes a snapshot (on a GPU: copies queued into page-locked
host memory on the training stream, so they see exactly this epoch's tensors and the steps never wait for them;
on the CPU: copies) and returns; the file is written and hashed while training goes on, one write at a time (a save
waits for the previous write, so at most one snapshot is pending and a checkpoint is never more than an epoch
behind).
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.atomic import write_text_atomic
from pipeline.models.checkpoint import CheckpointError, load_weights, save_weights
from pipeline.training.loop import TrainState

log = logging.getLogger(__name__)


@dataclass
class Snapshot:
    """Host copies of everything an epoch checkpoint holds, independent of the live model and optimiser: `tensors`,
    the JSON-able `meta`, and `ready` (a CUDA event after the copies from a GPU; None when none were made)."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    ready: Any = None


def snapshot(model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainState, best: dict[str, torch.Tensor]) -> Snapshot:
    """The `Snapshot` of an epoch: GPU tensors are copied into page-locked host memory on the current stream without
    waiting (`ready` says when they are complete), host tensors are copied at once."""
    gpu = False

    def host(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal gpu
        tensor = tensor.detach()
        if tensor.device.type == "cuda":
            gpu = True
            return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True).copy_(tensor, non_blocking=True)
        return tensor.to("cpu", copy=True).contiguous()

    tensors = {f"model/{k}": host(v) for k, v in model.state_dict().items()}
    best_is_model = state.best_epoch == state.epoch  # the loop copied the model's weights as the best ones this epoch
    if not best_is_model:
        tensors |= {f"best/{k}": host(v) for k, v in best.items()}
    opt = optimizer.state_dict()
    for index, slots in opt["state"].items():
        for name, value in slots.items():
            tensors[f"opt/{index}/{name}"] = host(torch.as_tensor(value))
    ready = None
    if gpu:
        ready = torch.cuda.Event()
        ready.record()
    return Snapshot(tensors, {"state": asdict(state), "param_groups": copy.deepcopy(opt["param_groups"]), "best_is_model": best_is_model}, ready)


def write_snapshot(directory: Path, snap: Snapshot, fingerprint: str) -> None:
    """Write a `snapshot` (once its copies are complete) as the epoch checkpoint of a run whose inputs have `fingerprint`."""
    if snap.ready is not None:
        snap.ready.synchronize()
    tensors, meta = {k: v.contiguous() for k, v in snap.tensors.items()}, snap.meta
    directory.mkdir(parents=True, exist_ok=True)
    # each epoch's weights get their own file, named in resume.json, which is replaced last: a kill at any point
    # leaves a resume.json whose weight file and digest belong together (the previous epoch's, or this one's)
    weights = f"resume-{meta['state']['epoch']}.safetensors"
    digest = save_weights(tensors, directory / weights)
    write_text_atomic(directory / "resume.json", json.dumps({**meta, "weights": weights, "digest": digest, "fingerprint": fingerprint}))
    for old in directory.glob("resume-*.safetensors"):
        if old.name != weights:
            old.unlink()


def save_resume(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainState, best: dict[str, torch.Tensor],
                fingerprint: str = "") -> None:
    """Write the epoch checkpoint of a run whose inputs have `fingerprint` (a resumed run must have the same)."""
    write_snapshot(directory, snapshot(model, optimizer, state, best), fingerprint)


class Checkpoints:
    """Epoch checkpoints in `directory` written in a background thread (module docstring); `save` is a loop's
    `save_state`, `close()` waits for the last write (and raises its error, as the next `save` does)."""

    def __init__(self, directory: Path, fingerprint: str) -> None:
        self.directory = directory
        self.fingerprint = fingerprint
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def save(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainState, best: dict[str, torch.Tensor]) -> None:
        self.close()
        snap = snapshot(model, optimizer, state, best)

        def write() -> None:
            try:
                write_snapshot(self.directory, snap, self.fingerprint)
            except BaseException as error:  # raised in the training thread at the next save or close
                self.error = error

        self.thread = threading.Thread(target=write, name="checkpoint", daemon=True)
        self.thread.start()

    def close(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def load_resume(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer, fingerprint: str = "") -> tuple[TrainState, dict[str, torch.Tensor]] | None:
    """Restore model and optimiser in place from `directory`; None when there is no usable checkpoint: none, one
    of a run with other inputs (another `fingerprint`), or a damaged one (a warning names it)."""
    if not (directory / "resume.json").is_file():
        return None
    try:
        meta = json.loads((directory / "resume.json").read_text())
        if meta.get("fingerprint", "") != fingerprint:
            log.info("%s: epoch checkpoint of a run with other inputs; training from the start", directory)
            return None
        device = next(model.parameters()).device
        tensors = load_weights(directory / meta["weights"], meta.get("digest"), device)
        state: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in tensors.items():
            if key.startswith("opt/"):
                _, index, name = key.split("/", 2)
                state.setdefault(int(index), {})[name] = value
        resumed = TrainState(**meta["state"])
        weights = {k.removeprefix("model/"): v for k, v in tensors.items() if k.startswith("model/")}
        current = model.state_dict()
        if weights.keys() != current.keys() or any(weights[k].shape != v.shape for k, v in current.items()):
            raise CheckpointError("its tensors do not fit the model")
        optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})  # checks the groups before it changes anything
        model.load_state_dict(weights)
        best = {k: v.clone() for k, v in weights.items()} if meta.get("best_is_model") else \
            {k.removeprefix("best/"): v for k, v in tensors.items() if k.startswith("best/")}
    except (CheckpointError, OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError) as e:
        log.warning("%s: epoch checkpoint unusable (%s); training from the start", directory, str(e).splitlines()[0])
        return None
    return resumed, best
