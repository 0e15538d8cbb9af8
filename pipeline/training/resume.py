"""Epoch checkpoints of a training run (`pipeline.training.loop.fit`'s save_state/load_state), so a killed run resumes.

Everything is safetensors (model, optimiser tensors, best weights) plus JSON (loop state and the
optimiser's param groups): no pickle. Written to a temporary file and renamed, so a kill during
the write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from pipeline.training.loop import TrainState


def save_resume(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainState, best: dict[str, torch.Tensor]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {f"model/{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tensors |= {f"best/{k}": v.detach().cpu().contiguous() for k, v in best.items()}
    opt = optimizer.state_dict()
    for index, slots in opt["state"].items():
        for name, value in slots.items():
            tensors[f"opt/{index}/{name}"] = torch.as_tensor(value).detach().cpu().contiguous()
    save_file(tensors, str(directory / "resume.safetensors.tmp"))
    (directory / "resume.json.tmp").write_text(json.dumps({"state": asdict(state), "param_groups": opt["param_groups"]}))
    os.replace(directory / "resume.safetensors.tmp", directory / "resume.safetensors")
    os.replace(directory / "resume.json.tmp", directory / "resume.json")


def load_resume(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[TrainState, dict[str, torch.Tensor]] | None:
    """Restore model and optimiser in place from `directory`; None when there is no checkpoint."""
    if not (directory / "resume.json").is_file() or not (directory / "resume.safetensors").is_file():
        return None
    meta = json.loads((directory / "resume.json").read_text())
    device = next(model.parameters()).device
    tensors = load_file(str(directory / "resume.safetensors"), device=str(device))
    model.load_state_dict({k.removeprefix("model/"): v for k, v in tensors.items() if k.startswith("model/")})
    best = {k.removeprefix("best/"): v for k, v in tensors.items() if k.startswith("best/")}
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("opt/"):
            _, index, name = key.split("/", 2)
            state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    return TrainState(**meta["state"]), best
