"""Checkpoints: weights and buffers as safetensors plus a JSON config. No pickle anywhere.

Layout of a checkpoint directory:
    model.safetensors   every parameter and buffer of the model (state_dict)
    config.json         {"schema_version", "method", "d", "n_latents", "k", "options", "provenance"}
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from pipeline.models import build, model_class
from pipeline.models.base import SparseModel

SCHEMA_VERSION = 1


def model_config(model: SparseModel, provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON config that, with the weights, rebuilds `model` exactly."""
    return {
        "schema_version": SCHEMA_VERSION,
        "method": model.method,
        "d": model.d,
        "n_latents": model.n_latents,
        "k": model.k,
        "options": dataclasses.asdict(model.options),
        "provenance": provenance or {},
    }


def save_model(model: SparseModel, directory: Path, provenance: dict[str, Any] | None = None) -> None:
    """Write `model.safetensors` and `config.json` into `directory` (created if missing)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().cpu().contiguous() for name, t in model.state_dict().items()}
    save_file(state, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(model_config(model, provenance), indent=2))


def read_config(directory: Path) -> dict[str, Any]:
    """The checkpoint's config.json, with clear errors for a missing or foreign file."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no checkpoint config here (expected config.json next to model.safetensors)")
    config = json.loads(path.read_text())
    if config.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {config.get('schema_version')!r}, this code reads {SCHEMA_VERSION}")
    return config


def load_model(directory: Path, device: str | torch.device = "cpu") -> SparseModel:
    """Rebuild the model saved in `directory`; outputs are identical to the saved model's."""
    directory = Path(directory)
    config = read_config(directory)
    weights = directory / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"{weights}: checkpoint weights missing")
    cls = model_class(config["method"])
    model = cls(d=config["d"], n_latents=config["n_latents"], k=config["k"], **config["options"])
    model.load_state_dict(load_file(str(weights), device=str(device)))
    return model.to(device).eval()


__all__ = ["build", "load_model", "save_model", "read_config", "model_config"]
