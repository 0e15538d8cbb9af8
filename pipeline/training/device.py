"""Which torch device a component runs on: one rule for the sparse models, the encoders and the decoder."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.settings import check_device


def resolve_device(device: str | torch.device) -> torch.device:
    """'auto' -> cuda when present, else cpu; any other known name -> that device."""
    if isinstance(device, torch.device):
        return device
    if check_device(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def host_to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A numpy batch as a tensor on `device` (float arrays become float32). To a GPU it goes through page-locked
    (pinned) host memory with a non-blocking copy, so the transfer overlaps the work already queued on the device;
    on the CPU it is a zero-copy view where the dtype allows."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if array.dtype.kind == "f":
        tensor = tensor.float()
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def device_name(device: str | torch.device) -> str:
    """The device in words for the records (every metrics file names where its numbers were computed): "cpu",
    "cuda:0 (NVIDIA H200)", "mps"."""
    device = resolve_device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return str(device)
