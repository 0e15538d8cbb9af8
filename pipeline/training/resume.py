"""Epoch checkpoints of a training run (`pipeline.training.loop.fit`'s save_state/load_state), so a killed run resumes.

Everything is safetensors (model, optimiser tensors, best weights) plus JSON (loop state, the
optimiser's param groups and the digest of the safetensors file): no pickle. Each file is written to a
temporary sibling and renamed, the JSON last, so a kill during the write leaves a pair that either matches or
is recognised as not matching. An epoch checkpoint that is damaged, or whose two files do not belong together,
is discarded with a warning and training starts from the beginning: it never blocks a rerun.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from pipeline.atomic import write_text_atomic
from pipeline.models.checkpoint import CheckpointError, load_weights, save_weights
from pipeline.training.loop import TrainState

log = logging.getLogger(__name__)


def save_resume(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainState, best: dict[str, torch.Tensor],
                fingerprint: str = "") -> None:
    """Write the epoch checkpoint of a run whose inputs have `fingerprint` (a resumed run must have the same)."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {f"model/{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tensors |= {f"best/{k}": v.detach().cpu().contiguous() for k, v in best.items()}
    opt = optimizer.state_dict()
    for index, slots in opt["state"].items():
        for name, value in slots.items():
            tensors[f"opt/{index}/{name}"] = torch.as_tensor(value).detach().cpu().contiguous()
    # each epoch's weights get their own file, named in resume.json, which is replaced last: a kill at any point
    # leaves a resume.json whose weight file and digest belong together (the previous epoch's, or this one's)
    weights = f"resume-{state.epoch}.safetensors"
    digest = save_weights(tensors, directory / weights)
    meta = {"state": asdict(state), "param_groups": opt["param_groups"], "weights": weights, "digest": digest, "fingerprint": fingerprint}
    write_text_atomic(directory / "resume.json", json.dumps(meta))
    for old in directory.glob("resume-*.safetensors"):
        if old.name != weights:
            old.unlink()


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
    except (CheckpointError, OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError) as e:
        log.warning("%s: epoch checkpoint unusable (%s); training from the start", directory, str(e).splitlines()[0])
        return None
    return resumed, {k.removeprefix("best/"): v for k, v in tensors.items() if k.startswith("best/")}
