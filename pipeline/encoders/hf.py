"""Hugging Face `transformers` encoders: CLIP (image + text), DINOv2 (image only), BLIP (image, plus its caption decoder).

Each takes a hub id ("openai/clip-vit-base-patch32") or a local folder written by `save_pretrained`,
loads the model in float32 and eval mode with frozen weights, and implements the `Encoder` protocol:
`encode_images` takes uint8 arrays (n, H, W, 3) (preprocessed as whole batches on the model's device by the
image processor itself when it is torchvision-backed, transformers' default) or pixels already preprocessed by
`preprocess` (float (n, 3, h, w), what the DataLoader path of `pipeline.images` yields) and returns float32 unit rows.

Offline: when `HF_HUB_OFFLINE`/`TRANSFORMERS_OFFLINE` is set, or the hub's host does not resolve
within a second, everything loads with `local_files_only=True`, so a hub id missing from the local cache
fails at once with a message saying how to provide the weights (a local folder, or network access),
instead of waiting on connection retries.

id: "<kind>:<name_or_path>:<first 12 hex of the sha256 of the loaded weights>" (`weights_digest`), so
two runs with different weights under one name never share a provenance string.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from pipeline.encoders.base import check_batch_size, weights_digest
from pipeline.encoders.pixels import DevicePreprocess, encode_pixels, processor_on_device
from pipeline.encoders.text import check_texts
from pipeline.training.device import resolve_device

logger = logging.getLogger(__name__)

T = TypeVar("T")
_TRUE = {"1", "true", "yes", "on"}
_DEFAULT_ENDPOINT = "https://huggingface.co"


# --- offline detection and loading ---------------------------------------------------------------


def _env_offline() -> bool:
    """True when HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set to a true value."""
    return any(os.environ.get(name, "").strip().lower() in _TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


@lru_cache(maxsize=4)
def _host_resolves(host: str, timeout_s: float = 1.0) -> bool:
    """Whether `host` resolves by DNS within `timeout_s` (getaddrinfo has no timeout of its own, hence the thread)."""
    result: list[bool] = []

    def resolve() -> None:
        try:
            socket.getaddrinfo(host, 443)
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=resolve, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(result and result[0])


def hub_offline() -> bool:
    """True when no network is configured for the Hugging Face hub: the offline variables are set, or its host does not resolve."""
    if _env_offline():
        return True
    host = urlparse(os.environ.get("HF_ENDPOINT", _DEFAULT_ENDPOINT)).hostname or "huggingface.co"
    return not _host_resolves(host)


def offline_help(name: str, what: str) -> str:
    """The one-line advice for weights that are not available offline."""
    return (f"{what} {name!r} is not in the local cache and no network is available (HF_HUB_OFFLINE=1 or the hub is "
            f"unreachable). Provide the weights: give a local path instead (a folder written by save_pretrained, or a "
            f"checkpoint file), or run once with network access (unset HF_HUB_OFFLINE) to fill the cache")


def local_folder(name_or_path: str | Path) -> Path | None:
    """The local folder `name_or_path` names, None for a hub id; FileNotFoundError for a path-like name that does not exist."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    text = str(name_or_path)
    if path.exists() or text.startswith(("/", "./", "../", "~")) or text.count("/") > 1 or "\\" in text:
        raise FileNotFoundError(f"{name_or_path}: no such model folder (expected a folder written by save_pretrained, or a hub id like 'org/name')")
    return None


def from_pretrained(loader: Callable[..., T], name_or_path: str | Path, what: str, **kwargs: Any) -> T:
    """`loader(name_or_path, local_files_only=..., **kwargs)` with clear errors.

    Local folders and, when offline, hub ids load with `local_files_only=True`; any OSError (missing cache
    entry, missing or unreadable files) is re-raised as one clear line saying how to provide the weights.
    """
    if not isinstance(name_or_path, (str, Path)) or not str(name_or_path).strip():
        raise ValueError(f"model: expected a hub id like 'org/name' or a local folder, got {name_or_path!r}")
    folder = local_folder(name_or_path)
    offline = folder is not None or hub_offline()
    try:
        return loader(str(folder if folder is not None else name_or_path), local_files_only=offline, **kwargs)
    except OSError as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if folder is not None:
            raise FileNotFoundError(f"{folder}: cannot load the {what} from this folder ({reason}); expected files written by save_pretrained") from error
        if offline:
            raise FileNotFoundError(offline_help(str(name_or_path), what)) from error
        raise FileNotFoundError(f"{what} {str(name_or_path)!r} could not be downloaded ({reason}); check the hub id, "
                                "or give a local folder written by save_pretrained") from error


def _freeze(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """float32, eval mode, no gradients, on `device`."""
    model = model.to(device=device, dtype=torch.float32).eval()
    model.requires_grad_(False)
    return model


class ImageProcessorTransform:
    """A picklable `preprocess`: PIL RGB image -> float32 (3, h, w) through a transformers image processor."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor

    def __call__(self, image: Image.Image) -> Tensor:
        return self.processor(images=image, return_tensors="pt")["pixel_values"][0].float()


def _pooled(output: Any) -> Tensor:
    """The pooled features of a transformers output (newer versions return a ModelOutput, older a tensor)."""
    return output if isinstance(output, Tensor) else output.pooler_output


class _HFImageEncoder:
    """Shared image side: `preprocess` (PIL image by image), `device_preprocess` (the image processor on whole uint8
    batches on the device, when it is torchvision-backed), `input_size` and `encode_images` over a `_features`
    forward."""

    id: str
    dim: int
    has_text: bool
    device: torch.device
    preprocess: ImageProcessorTransform
    input_size: tuple[int, int] | None

    @property
    def device_preprocess(self) -> DevicePreprocess | None:
        return processor_on_device(self.preprocess.processor)

    def _features(self, pixels: Tensor) -> Tensor:
        raise NotImplementedError

    def encode_images(self, images: np.ndarray | Tensor, batch_size: int = 256) -> np.ndarray:
        """uint8 (n, H, W, 3), or float (n, 3, h, w) already preprocessed by `preprocess` -> float32 (n, dim), unit rows."""
        return encode_pixels(self._features, images, self.preprocess, batch_size, self.device, self.input_size, self.device_preprocess)


def _image_only_error(model_id: str, kind: str) -> TypeError:
    return TypeError(f"{model_id}: {kind} is an image-only model (has_text=False): it cannot embed texts, so concept naming "
                     "is unavailable for it; use a CLIP-like encoder (open_clip, hf_clip) to name concepts")


# --- the encoders ----------------------------------------------------------------------------------


class HFClipEncoder(_HFImageEncoder):
    """transformers `CLIPModel` + its image processor and tokenizer: image and text embeddings in one space (dim = projection_dim)."""

    has_text = True

    def __init__(self, name_or_path: str | Path, device: str | torch.device = "auto") -> None:
        from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

        self.device = resolve_device(device)
        self.model = _freeze(from_pretrained(CLIPModel.from_pretrained, name_or_path, "CLIP model", dtype=torch.float32), self.device)
        self.preprocess = ImageProcessorTransform(from_pretrained(AutoImageProcessor.from_pretrained, name_or_path, "CLIP image processor"))
        self.tokenizer = from_pretrained(AutoTokenizer.from_pretrained, name_or_path, "CLIP tokenizer")
        config = self.model.config
        self.dim = int(config.projection_dim)
        self.input_size = (config.vision_config.image_size,) * 2
        self.max_tokens = int(config.text_config.max_position_embeddings)
        self.id = f"hf_clip:{name_or_path}:{weights_digest(self.model)[:12]}"
        logger.info("loaded %s on %s", self.id, self.device)

    def _features(self, pixels: Tensor) -> Tensor:
        return _pooled(self.model.get_image_features(pixel_values=pixels))

    def encode_texts(self, texts: list[str], batch_size: int = 256) -> np.ndarray:
        """n strings -> float32 (n, dim), unit rows (truncated to the model's context length)."""
        check_texts(texts)
        check_batch_size(batch_size)
        out = []
        with torch.no_grad():
            for start in range(0, len(texts), batch_size):
                tokens = self.tokenizer(list(texts[start : start + batch_size]), padding=True, truncation=True,
                                        max_length=self.max_tokens, return_tensors="pt").to(self.device)
                features = _pooled(self.model.get_text_features(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"]))
                out.append(torch.nn.functional.normalize(features.float(), dim=-1).cpu().numpy())
        return np.concatenate(out)


class Dinov2Encoder(_HFImageEncoder):
    """transformers DINOv2 (`AutoModel`): the CLS token after the final layernorm (`pooler_output`), dim = hidden_size.

    Image only: `encode_texts` raises TypeError (no text tower, so no concept naming).
    """

    has_text = False

    def __init__(self, name_or_path: str | Path, device: str | torch.device = "auto") -> None:
        from transformers import AutoImageProcessor, AutoModel

        self.device = resolve_device(device)
        self.model = _freeze(from_pretrained(AutoModel.from_pretrained, name_or_path, "DINOv2 model", dtype=torch.float32), self.device)
        self.preprocess = ImageProcessorTransform(from_pretrained(AutoImageProcessor.from_pretrained, name_or_path, "DINOv2 image processor"))
        self.dim = int(self.model.config.hidden_size)
        self.input_size = None  # DINOv2 interpolates its position embeddings: any size divisible into patches works
        self.id = f"dinov2:{name_or_path}:{weights_digest(self.model)[:12]}"
        logger.info("loaded %s on %s", self.id, self.device)

    def _features(self, pixels: Tensor) -> Tensor:
        output = self.model(pixel_values=pixels)
        pooled = getattr(output, "pooler_output", None)
        return pooled if pooled is not None else output.last_hidden_state[:, 0]

    def encode_texts(self, texts: list[str], batch_size: int = 256) -> np.ndarray:
        """Always raises TypeError: DINOv2 has no text tower."""
        raise _image_only_error(self.id, "DINOv2")


class BlipEncoder(_HFImageEncoder):
    """transformers BLIP captioning model (`BlipForConditionalGeneration`): the vision encoder's pooled CLS embedding.

    `pooler_output` of `BlipVisionModel` (the CLS token after `post_layernorm`), dim = vision hidden_size.
    `model` is the whole loaded model, so its text decoder can caption embeddings later; `name_or_path`
    says where to load the matching tokenizer/processor from. `encode_texts` raises TypeError: the
    captioning model has no text embedding in the image space.
    """

    has_text = False

    def __init__(self, name_or_path: str | Path, device: str | torch.device = "auto") -> None:
        from transformers import AutoImageProcessor, BlipForConditionalGeneration

        self.device = resolve_device(device)
        self.name_or_path = str(name_or_path)
        self.model = _freeze(from_pretrained(BlipForConditionalGeneration.from_pretrained, name_or_path, "BLIP model", dtype=torch.float32), self.device)
        self.preprocess = ImageProcessorTransform(from_pretrained(AutoImageProcessor.from_pretrained, name_or_path, "BLIP image processor"))
        vision = self.model.config.vision_config
        self.dim = int(vision.hidden_size)
        self.input_size = (vision.image_size,) * 2
        self.id = f"blip:{name_or_path}:{weights_digest(self.model)[:12]}"
        logger.info("loaded %s on %s", self.id, self.device)

    def _features(self, pixels: Tensor) -> Tensor:
        return self.model.vision_model(pixel_values=pixels).pooler_output

    def encode_texts(self, texts: list[str], batch_size: int = 256) -> np.ndarray:
        """Always raises TypeError: BLIP's captioning model embeds no texts (use its decoder for free-form captions)."""
        raise _image_only_error(self.id, "BLIP (captioning)")
