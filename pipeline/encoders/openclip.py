"""open_clip encoders: any architecture with a pretrained tag (downloaded when a network is available) or a local checkpoint.

`OpenClipEncoder("ViT-B-32", "laion2b_s34b_b79k")` builds the model with
`open_clip.create_model_and_transforms` and uses open_clip's own inference transform (`preprocess`,
PIL image -> float (3, h, w)) and tokenizer, so embeddings match what open_clip users get.

weights:
- a pretrained tag of `arch` (`open_clip.list_pretrained_tags_by_model`). Offline (see
  `pipeline.encoders.hf.hub_offline`) the tag must already be in the local cache, else a clear error comes
  at once. The tag's QuickGELU flag is applied (OpenAI weights need it), as are its preprocessing settings.
- a local checkpoint file: `.safetensors`, or a torch file (`.pt`, `.pth`, `.bin`) read with
  `torch.load(weights_only=True)` (no pickle code runs).
- None: random initialisation (for tests and the "untrained" sanity baseline); a warning is logged.

id: "open_clip:<arch>:<tag>", "open_clip:<arch>:file-<first 12 hex of the file's sha256>", or
"open_clip:<arch>:random-<first 12 hex of the sha256 of the initial weights>".
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from pipeline.atomic import atomic_file
from pipeline.encoders.base import check_batch_size, weights_digest
from pipeline.encoders.hf import hub_offline, offline_help
from pipeline.encoders.pixels import encode_pixels, pil_transform_of
from pipeline.encoders.text import check_texts
from pipeline.training.device import resolve_device

logger = logging.getLogger(__name__)

CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")


def file_sha256(path: Path, chunk: int = 1 << 24) -> str:
    """sha256 (hex) of a file, read in 16 MiB chunks so large checkpoints do not fill memory."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def is_checkpoint_path(weights: str | Path) -> bool:
    """Whether `weights` names a file rather than a pretrained tag (a tag has no path separator nor checkpoint suffix)."""
    text = str(weights)
    return isinstance(weights, Path) or os.sep in text or "/" in text or text.endswith(CHECKPOINT_SUFFIXES) or Path(text).is_file()


def cached_tag_file(tag_cfg: dict[str, Any]) -> str | None:
    """The local file of an open_clip pretrained tag if it is already cached (hub cache or ~/.cache/clip), else None.

    Mirrors where `open_clip.pretrained.download_pretrained` puts files, without touching the network.
    """
    if tag_cfg.get("file"):
        return tag_cfg["file"] if os.path.isfile(tag_cfg["file"]) else None
    hub = tag_cfg.get("hf_hub", "")
    if hub:
        from huggingface_hub import try_to_load_from_cache

        repo, filename = os.path.split(hub)
        filename = filename or "open_clip_pytorch_model.bin"
        candidates = [filename[: -len(Path(filename).suffix)] + ".safetensors"] if filename.endswith((".bin", ".pth")) else []
        for name in [*candidates, filename]:
            found = try_to_load_from_cache(repo_id=repo, filename=name)
            if isinstance(found, str) and os.path.isfile(found):
                return found
    url = tag_cfg.get("url", "")
    if url:
        path = os.path.join(os.path.expanduser("~/.cache/clip"), os.path.basename(url))
        if os.path.isfile(path):
            return path
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class OpenClipEncoder:
    """An open_clip model behind the `Encoder` interface (image and text embeddings in one space).

    arch: an open_clip architecture name ("ViT-B-32", "ViT-L-14", "RN50", ...), built in or registered.
    weights: a pretrained tag, a local checkpoint file, or None (random init); see the module docstring.
    model_config: optional JSON file of a custom architecture (open_clip's model-config format: embed_dim,
    vision_cfg, text_cfg); it is registered with `open_clip.add_model_config` and must be named `<arch>.json`.
    device: "auto" picks cuda when available.

    Attributes: `model` (the open_clip model, frozen, eval), `preprocess` (open_clip's inference
    transform, PIL -> float (3, h, w), picklable for DataLoader workers), `device_preprocess` (the same transform
    on uint8 batches on the device, `pipeline.encoders.pixels.PilTransform`; None when open_clip built a transform
    it does not mirror: images are then preprocessed one by one), `tokenizer`, `input_size` (h, w).
    """

    has_text = True

    def __init__(self, arch: str, weights: str | Path | None = None, device: str | torch.device = "auto", model_config: str | Path | None = None) -> None:
        import open_clip

        if not isinstance(arch, str) or not arch.strip():
            raise ValueError(f"arch: expected an open_clip architecture name like 'ViT-B-32', got {arch!r}")
        if model_config is not None:
            config_path = Path(model_config)
            if not config_path.is_file():
                raise FileNotFoundError(f"model_config: {config_path} does not exist (expected an open_clip model config JSON)")
            if config_path.stem != arch:
                raise ValueError(f"model_config: the file must be named after the architecture ({arch}.json), got {config_path.name}")
            open_clip.add_model_config(config_path)
        if arch not in open_clip.list_models():
            raise ValueError(f"arch: unknown open_clip architecture {arch!r}; known: {', '.join(open_clip.list_models()[:12])}, ... "
                             "(or give model_config, a JSON file <arch>.json)")
        self.device = resolve_device(device)
        kwargs: dict[str, Any] = {}
        if weights is None:
            pretrained = None
            provenance = None
        elif is_checkpoint_path(weights):
            path = Path(weights).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"weights: {path} does not exist (expected an open_clip checkpoint file, .safetensors or .pt)")
            if not path.name.endswith(CHECKPOINT_SUFFIXES):
                raise ValueError(f"weights: {path} has an unknown suffix; expected one of {', '.join(CHECKPOINT_SUFFIXES)}")
            pretrained = str(path)
            provenance = f"file-{file_sha256(path)[:12]}"
        else:
            tags = open_clip.list_pretrained_tags_by_model(arch)
            tag_cfg = open_clip.get_pretrained_cfg(arch, str(weights))
            if not tag_cfg:
                raise ValueError(f"weights: {weights!r} is not a pretrained tag of {arch} (known: {', '.join(tags) or 'none'}) "
                                 "nor an existing checkpoint file")
            kwargs["force_quick_gelu"] = bool(tag_cfg.get("quick_gelu", False))
            pretrained = str(weights)
            if hub_offline():
                cached = cached_tag_file(tag_cfg)
                if cached is None:
                    raise FileNotFoundError(offline_help(f"{arch}:{weights}", "open_clip weights"))
                # Load the cached file directly (no network call); keep the tag's preprocessing settings.
                pretrained = cached
                kwargs.update(image_mean=tag_cfg.get("mean"), image_std=tag_cfg.get("std"),
                              image_interpolation=tag_cfg.get("interpolation"), image_resize_mode=tag_cfg.get("resize_mode"))
            provenance = str(weights)
        try:
            model, _, preprocess = open_clip.create_model_and_transforms(arch, pretrained=pretrained, weights_only=True, **kwargs)
        except (RuntimeError, OSError, ValueError, KeyError, pickle.UnpicklingError) as error:
            raise ValueError(f"open_clip {arch} with weights {str(weights)!r}: cannot be built or loaded ({_first_line(error)})") from error
        model = model.to(self.device).eval()
        model.requires_grad_(False)
        if provenance is None:
            provenance = f"random-{weights_digest(model)[:12]}"
            logger.warning("open_clip %s: no weights given, the model is randomly initialised", arch)
        self.model = model
        self.preprocess = preprocess
        self.device_preprocess = pil_transform_of(preprocess)
        self.tokenizer = open_clip.get_tokenizer(arch)
        self.arch = arch
        self.id = f"open_clip:{arch}:{provenance}"
        size = model.visual.image_size
        self.input_size = (size, size) if isinstance(size, int) else tuple(size)
        with torch.no_grad():
            self.dim = int(self._features(torch.zeros(1, 3, *self.input_size, device=self.device)).shape[-1])
        logger.info("loaded %s on %s (d=%d)", self.id, self.device, self.dim)

    def _features(self, pixels: Tensor) -> Tensor:
        return self.model.encode_image(pixels)

    def encode_images(self, images: np.ndarray | Tensor, batch_size: int = 256) -> np.ndarray:
        """uint8 (n, H, W, 3), or float (n, 3, h, w) already preprocessed by `preprocess` -> float32 (n, dim), unit rows."""
        return encode_pixels(self._features, images, self.preprocess, batch_size, self.device, self.input_size, self.device_preprocess)

    def encode_texts(self, texts: list[str], batch_size: int = 256) -> np.ndarray:
        """n strings -> float32 (n, dim), unit rows (open_clip's tokenizer; long texts are truncated to the context length)."""
        check_texts(texts)
        check_batch_size(batch_size)
        out = []
        with torch.no_grad():
            for start in range(0, len(texts), batch_size):
                tokens = self.tokenizer(list(texts[start : start + batch_size])).to(self.device)
                out.append(F.normalize(self.model.encode_text(tokens).float(), dim=-1).cpu().numpy())
        return np.concatenate(out)


def save_random_weights(arch: str, path: str | Path, seed: int = 0) -> Path:
    """A randomly initialised open_clip `arch` (weights seeded by `seed`) saved as safetensors at `path`: the
    architecture of a pretrained tag, loadable offline as `weights: <path>` (the smoke variants of the real-model
    presets run the real architecture this way). An existing file is kept. Returns the path."""
    import open_clip
    from safetensors.torch import save_file

    path = Path(path)
    if path.is_file():
        return path
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = open_clip.create_model(arch)
    with atomic_file(path) as tmp:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp))
    logger.info("open_clip %s: random weights (seed %d) saved to %s", arch, seed, path)
    return path
