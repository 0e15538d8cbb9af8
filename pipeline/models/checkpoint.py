"""Checkpoints: weights and buffers as safetensors plus a JSON config. No pickle anywhere.

Layout of a checkpoint directory:
    model.safetensors   every parameter and buffer of the model (state_dict)
    config.json         {"schema_version", "method", "d", "n_latents", "k", "options", "weights_digest", "provenance"}

`weights_digest` is the sha256 of model.safetensors (`save_weights`): `load_model` checks it before it reads the
weights (`load_weights`), so a file whose bytes changed after it was written, even into finite numbers of the same
size, is a `CheckpointError` naming the file, never a silently different model. Both files are written under
temporary names and renamed into place, the config last. The weight-file helpers serve every safetensors file
the pipeline reuses (the caption decoder, the epoch checkpoints of a training run).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from pipeline.atomic import atomic_file, write_text_atomic
from pipeline.models.base import SparseModel
from pipeline.models.registry import build, model_class
from pipeline.provenance import file_digest

SCHEMA_VERSION = 2  # 2: config.json records the weight file's digest
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable, from another schema, or its weights differ from its recorded digest."""


def save_weights(tensors: dict[str, torch.Tensor], path: Path) -> str:
    """Write `tensors` as a safetensors file at `path` (a temporary sibling renamed into place); returns its digest."""
    with atomic_file(Path(path)) as tmp:
        save_file({name: t.detach().cpu().contiguous() for name, t in tensors.items()}, str(tmp))
        return file_digest(tmp)


def load_weights(path: Path, digest: str | None, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file at `path` after checking its bytes against `digest` (from `save_weights`).

    CheckpointError (one line naming the file) when it is missing, its digest differs, or it does not parse."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: weights missing")
    if not isinstance(digest, str) or file_digest(path) != digest:
        raise CheckpointError(f"{path}: weights differ from the digest recorded when they were written (the file is damaged)")
    try:
        return load_file(str(path), device=str(device))
    except Exception as e:  # safetensors raises its own error types for broken headers
        raise CheckpointError(f"{path}: not a readable safetensors file ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def model_config(model: SparseModel, provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON config that, with the weights, rebuilds `model` exactly (`weights_digest` is added by `save_model`)."""
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
    """Write `model.safetensors` and `config.json` (with the weights' digest) into `directory` (created if missing)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {**model_config(model, provenance), "weights_digest": save_weights(model.state_dict(), directory / WEIGHTS_FILE)}
    write_text_atomic(directory / CONFIG_FILE, json.dumps(config, indent=2))


def read_config(directory: Path) -> dict[str, Any]:
    """The checkpoint's config.json; CheckpointError for a missing, unreadable or foreign file."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: no checkpoint config here (expected {CONFIG_FILE} next to {WEIGHTS_FILE})")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(config, dict) or config.get("schema_version") != SCHEMA_VERSION:
        found = config.get("schema_version") if isinstance(config, dict) else type(config).__name__
        raise CheckpointError(f"{path}: schema_version {found!r}, this code reads {SCHEMA_VERSION}")
    return config


def load_model(directory: Path, device: str | torch.device = "cpu") -> SparseModel:
    """Rebuild the model saved in `directory`; outputs are identical to the saved model's.

    CheckpointError (one line naming the file) for a missing or damaged checkpoint."""
    directory = Path(directory)
    config = read_config(directory)
    state = load_weights(directory / WEIGHTS_FILE, config.get("weights_digest"), device)
    try:
        cls = model_class(config["method"])
        model = cls(d=config["d"], n_latents=config["n_latents"], k=config["k"], **config["options"])
        model.load_state_dict(state)
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{directory}: weights do not fit the model in {CONFIG_FILE} ({str(e).splitlines()[0]})") from None
    return model.to(device).eval()


__all__ = ["build", "load_model", "save_model", "read_config", "model_config", "save_weights", "load_weights", "CheckpointError"]
