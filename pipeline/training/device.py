"""Which torch device a component runs on: one rule for the sparse models, the encoders and the decoder."""

from __future__ import annotations

import re
from typing import Annotated

import torch
from pydantic import AfterValidator

_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def check_device(name: str) -> str:
    """`name` if it is a device this project knows ("auto", "cpu", "cuda", "cuda:<index>", "mps"), else ValueError."""
    if not isinstance(name, str) or not _DEVICE.fullmatch(name):
        raise ValueError(f"unknown device {name!r}; expected 'auto', 'cpu', 'cuda', 'cuda:<index>' or 'mps'")
    return name


#: a settings field naming a device (validated by `check_device`)
Device = Annotated[str, AfterValidator(check_device)]


def resolve_device(device: str | torch.device) -> torch.device:
    """'auto' -> cuda when present, else cpu; any other known name -> that device."""
    if isinstance(device, torch.device):
        return device
    if check_device(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)
