"""The embedded offline vision-language model: a small CNN aligned to the frozen all-MiniLM-L6-v2 text encoder.

No CLIP weights exist offline, so the pipeline trains its own CLIP-like model on the procedural scenes.
The image tower (4 conv blocks, global average pooling, linear head) and a learned linear text projection
384 -> d are trained with the CLIP loss (symmetric InfoNCE, learnable temperature) against the *frozen*
MiniLM sentence embeddings of the captions. Because the text side is a pretrained language model,
any English word or phrase can later be embedded as a concept, not only the training captions.

Layout of a saved model directory (`save_embedded` / `load_embedded`):
    model.safetensors   every parameter and buffer of `EmbeddedCLIP` (no pickle)
    config.json         {"schema_version", "kind": "embedded", "config": EmbeddedConfig fields,
                         "text_model", "weights_sha256"}
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from pipeline.encoders.base import Encoder, check_batch_size, check_images
from pipeline.encoders.text import TEXT_DIM, MiniLM, check_texts

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
MAX_LOGIT_SCALE = math.log(100.0)  # CLIP's clamp: temperature never below 1/100


@dataclass
class EmbeddedConfig:
    """Architecture and training settings of the embedded model.

    embed_dim: shared image/text dimension d. width: channels of the first conv block (then 2w, 4w, 4w).
    image_size: H = W of the input images. shift: maximum random translation in pixels for augmentation
    (None -> image_size // 16). flip: random horizontal flips; off by default because captions may name
    left/right. Colours are never augmented: colour is an attribute. warmup_frac: linear learning-rate
    warm-up as a fraction of all steps, then cosine decay to 0. device: "auto" picks cuda when present;
    training is bit-for-bit deterministic for a seed on CPU.
    """

    embed_dim: int = 128
    width: int = 24
    image_size: int = 64
    epochs: int = 15
    batch_size: int = 128
    lr: float = 2e-3
    weight_decay: float = 1e-4
    seed: int = 0
    warmup_frac: float = 0.05
    shift: int | None = None
    flip: bool = False
    device: str = "auto"

    def __post_init__(self) -> None:
        problems = []
        for name in ("embed_dim", "width", "epochs"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.image_size < 16:
            problems.append(f"image_size must be >= 16 (four 2x poolings), got {self.image_size}")
        if self.batch_size < 2:
            problems.append(f"batch_size must be >= 2 (a contrastive batch needs negatives), got {self.batch_size}")
        if not self.lr > 0:
            problems.append(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            problems.append(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not 0 <= self.warmup_frac < 1:
            problems.append(f"warmup_frac must be in [0, 1), got {self.warmup_frac}")
        if self.shift is not None and not 0 <= self.shift < self.image_size:
            problems.append(f"shift must be in [0, image_size), got {self.shift}")
        if problems:
            raise ValueError("EmbeddedConfig: " + "; ".join(problems))

    @classmethod
    def tiny(cls, **overrides: Any) -> "EmbeddedConfig":
        """The tiny preset: 32 px images, d = 32, a narrow tower (seconds on one CPU core)."""
        values: dict[str, Any] = dict(embed_dim=32, width=16, image_size=32, epochs=25, batch_size=32, lr=3e-3)
        values.update(overrides)
        return cls(**values)

    @property
    def max_shift(self) -> int:
        """The augmentation's maximum translation in pixels."""
        return self.image_size // 16 if self.shift is None else self.shift


def resolve_device(device: str | torch.device) -> torch.device:
    """"auto" -> cuda when available, else cpu; anything else is passed to torch.device."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


# --- the model ---------------------------------------------------------------------------


def _conv_block(c_in: int, c_out: int, stride: int = 1, pool: bool = True) -> nn.Sequential:
    """3x3 conv (stride 1 or 2) -> BatchNorm -> ReLU (-> 2x2 max-pool): each block halves the resolution."""
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


class EmbeddedCLIP(nn.Module):
    """Image tower + text projection + logit scale.

    Image tower: a stride-2 3x3 conv stem (w channels), then 3 conv blocks with 2x2 max-pooling (2w, 4w,
    4w channels): 64 px -> 32 -> 16 -> 8 -> 4; global average pooling; a linear layer to d. The stem
    works at half resolution because full-resolution layers cost most of the CPU time (about 4x less than
    four pooled blocks from full resolution at width 32, measured); its overlapping 3x3 windows still see
    every pixel. Conv weights and inputs are channels-last, which is faster on CPU (about 1.3x). Text side: a linear projection (384 -> d, no bias) of frozen MiniLM
    features, initialised with orthonormal rows so that it starts as a plain subspace of MiniLM's space.
    Both outputs are L2-normalised. `logit_scale` is log(1 / temperature), initialised to log(1 / 0.07).
    """

    def __init__(self, embed_dim: int, width: int, image_size: int, text_dim: int = TEXT_DIM) -> None:
        super().__init__()
        self.embed_dim = int(embed_dim)
        self.image_size = int(image_size)  # the size it is trained for; encoders refuse other sizes
        self.text_dim = int(text_dim)
        w = int(width)
        self.tower = nn.Sequential(_conv_block(3, w, stride=2, pool=False), _conv_block(w, 2 * w), _conv_block(2 * w, 4 * w), _conv_block(4 * w, 4 * w))
        self.image_head = nn.Linear(4 * w, embed_dim)
        self.text_projection = nn.Linear(text_dim, embed_dim, bias=False)
        nn.init.orthogonal_(self.text_projection.weight)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        # fixed input normalisation (a buffer so it travels with the weights): [0, 1] -> roughly zero mean, unit scale
        self.register_buffer("pixel_mean", torch.full((1, 3, 1, 1), 0.5))
        self.register_buffer("pixel_std", torch.full((1, 3, 1, 1), 0.25))
        # load_state_dict copies into these tensors, so a loaded model keeps this layout and computes bit-identically
        self.to(memory_format=torch.channels_last)

    def encode_image(self, pixels: Tensor) -> Tensor:
        """float (n, 3, H, W) in [0, 1] -> (n, d) unit rows."""
        normalised = ((pixels - self.pixel_mean) / self.pixel_std).contiguous(memory_format=torch.channels_last)
        features = self.tower(normalised).mean(dim=(2, 3))
        return F.normalize(self.image_head(features), dim=1)

    def encode_text(self, text_features: Tensor) -> Tensor:
        """Frozen MiniLM features (n, 384) -> (n, d) unit rows."""
        return F.normalize(self.text_projection(text_features), dim=1)

    def forward(self, pixels: Tensor, text_features: Tensor) -> tuple[Tensor, Tensor]:
        """(image embeddings (n, d), text embeddings (m, d))."""
        return self.encode_image(pixels), self.encode_text(text_features)


def pixels_from_uint8(images: Tensor) -> Tensor:
    """uint8 (n, H, W, 3) -> float32 (n, 3, H, W) in [0, 1]."""
    return images.permute(0, 3, 1, 2).float().div_(255.0)


def clip_loss(image_emb: Tensor, text_emb: Tensor, logit_scale: Tensor, caption_ids: Tensor | None = None) -> Tensor:
    """Symmetric InfoNCE (the CLIP loss) for n matched pairs of unit vectors (n, d) and (n, d).

    logits = exp(logit_scale) * image_emb @ text_emb.T; the loss is the mean of the image->text and
    text->image cross-entropies. Row i's target is pair i. With `caption_ids` (n,) ints, every pair
    with the *same caption* is a positive too (the target spreads uniformly over them): the procedural
    captions repeat, and pushing an image away from an identical caption would be label noise.
    With distinct ids this is exactly the standard CLIP loss.
    """
    if image_emb.ndim != 2 or image_emb.shape != text_emb.shape:
        raise ValueError(f"clip_loss: expected image_emb and text_emb of one shape (n, d), got {tuple(image_emb.shape)} and {tuple(text_emb.shape)}")
    logits = logit_scale.exp() * image_emb @ text_emb.T
    n = logits.shape[0]
    if caption_ids is None:
        targets = torch.eye(n, dtype=logits.dtype, device=logits.device)
    else:
        if caption_ids.shape != (n,):
            raise ValueError(f"clip_loss: caption_ids must have shape ({n},), got {tuple(caption_ids.shape)}")
        same = (caption_ids[:, None] == caption_ids[None, :]).to(logits.dtype)
        targets = same / same.sum(dim=1, keepdim=True)  # symmetric matrix: the same targets serve both directions
    image_to_text = -(targets * F.log_softmax(logits, dim=1)).sum(dim=1).mean()
    text_to_image = -(targets * F.log_softmax(logits.T, dim=1)).sum(dim=1).mean()
    return (image_to_text + text_to_image) / 2


def augment(images: Tensor, max_shift: int, flip: bool, generator: torch.Generator) -> Tensor:
    """Random translation by up to `max_shift` pixels (edge pixels repeated) and optional horizontal flip.

    images: float (n, 3, H, W). Colours are left untouched. Offsets come from `generator` (on the CPU)
    so a seed fixes the augmentation.
    """
    n, _, h, w = images.shape
    if max_shift > 0:
        padded = F.pad(images, (max_shift,) * 4, mode="replicate")
        offsets = torch.randint(0, 2 * max_shift + 1, (2, n), generator=generator).to(images.device)
        rows = offsets[0][:, None] + torch.arange(h, device=images.device)  # (n, H)
        cols = offsets[1][:, None] + torch.arange(w, device=images.device)  # (n, W)
        batch = torch.arange(n, device=images.device)[:, None, None]
        # advanced indices around a slice put their dims first: (n, H, W, 3)
        images = padded[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
    if flip:
        mirror = (torch.rand(n, generator=generator) < 0.5).to(images.device)
        images = torch.where(mirror[:, None, None, None], images.flip(3), images)
    return images.contiguous()


# --- training ----------------------------------------------------------------------------


def _build_model(config: EmbeddedConfig) -> EmbeddedCLIP:
    """A freshly initialised model; the initialisation depends only on config.seed (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return EmbeddedCLIP(config.embed_dim, config.width, config.image_size)


def _lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay from 1 to 0 at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def encode_images_with(model: EmbeddedCLIP, images: np.ndarray, device: torch.device, batch_size: int = 256) -> np.ndarray:
    """uint8 (n, H, W, 3) -> float32 (n, d) unit rows through `model` (in eval mode), batch by batch."""
    out = np.empty((images.shape[0], model.embed_dim), dtype=np.float32)
    with torch.no_grad():
        for start in range(0, images.shape[0], batch_size):
            batch = torch.from_numpy(np.ascontiguousarray(images[start : start + batch_size])).to(device)
            out[start : start + batch_size] = model.encode_image(pixels_from_uint8(batch)).cpu().numpy()
    return out


def retrieval_accuracy(image_emb: np.ndarray, captions: list[str], text_emb_unique: np.ndarray, unique: list[str]) -> float:
    """Image->text top-1 accuracy: the nearest of the distinct captions `unique` must be the image's own caption."""
    index = {caption: i for i, caption in enumerate(unique)}
    truth = np.array([index[c] for c in captions])
    return float(np.mean(np.argmax(image_emb @ text_emb_unique.T, axis=1) == truth))


def train_embedded(
    images: np.ndarray,
    captions: list[str],
    config: EmbeddedConfig,
    text_encoder: MiniLM | None = None,
    val: tuple[np.ndarray, list[str]] | None = None,
) -> tuple[EmbeddedCLIP, list[dict[str, float]]]:
    """Train the embedded model on uint8 images (n, S, S, 3) (S = config.image_size) and their n captions.

    The MiniLM features of the distinct captions are computed once (no grad) and kept in memory; MiniLM
    is never updated. AdamW (weight decay on conv/linear weights only), warm-up + cosine schedule, CLIP
    loss with same-caption positives. Returns the model (eval mode) and one dict per epoch:
    {"epoch", "loss" (mean over the epoch's batches), "lr" (at the epoch's end), "temperature",
    "seconds" (the epoch's training time, validation excluded)}
    plus "val_i2t_accuracy" and "val_chance" (1 / distinct val captions) when `val` = (images, captions).
    """
    check_images(images, config.image_size)
    check_texts(captions, "captions")
    if len(captions) != images.shape[0]:
        raise ValueError(f"captions: expected one caption per image ({images.shape[0]}), got {len(captions)}")
    if images.shape[0] < 2:
        raise ValueError(f"images: contrastive training needs at least 2 images, got {images.shape[0]}")
    if val is not None:
        check_images(val[0], config.image_size, "val images")
        check_texts(val[1], "val captions")
        if len(val[1]) != val[0].shape[0]:
            raise ValueError(f"val captions: expected one caption per val image ({val[0].shape[0]}), got {len(val[1])}")
    device = resolve_device(config.device)
    text_encoder = text_encoder if text_encoder is not None else MiniLM(device)

    started = time.perf_counter()
    unique, inverse = np.unique(np.asarray(captions, dtype=object).astype(str), return_inverse=True)
    text_features = torch.from_numpy(text_encoder.encode([str(u) for u in unique])).to(device)  # (u, 384), frozen
    caption_ids = torch.from_numpy(inverse.reshape(-1)).long()
    val_unique: list[str] = []
    val_features: Tensor | None = None
    if val is not None:
        val_unique = sorted(set(val[1]))
        val_features = torch.from_numpy(text_encoder.encode(val_unique)).to(device)
    logger.info("embedded model: %d images, %d distinct captions (MiniLM features in %.1f s), device %s",
                len(captions), len(unique), time.perf_counter() - started, device)

    model = _build_model(config).to(device).train()
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=config.lr)
    n = images.shape[0]
    batch_size = min(config.batch_size, n)
    steps_per_epoch = n // batch_size  # drop the last partial batch: a tiny batch is a weak contrastive signal
    total = steps_per_epoch * config.epochs
    warmup = max(1, int(config.warmup_frac * total))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, total, warmup))
    generator = torch.Generator().manual_seed(config.seed)
    pixels_all = torch.from_numpy(np.ascontiguousarray(images))  # uint8, converted per batch to keep memory at n*S*S*3 bytes

    history: list[dict[str, float]] = []
    bar = tqdm(total=total, desc="embedded model", unit="step", disable=None, leave=False)
    for epoch in range(config.epochs):
        start, losses = time.perf_counter(), []
        order = torch.randperm(n, generator=generator)
        for step in range(steps_per_epoch):
            rows = order[step * batch_size : (step + 1) * batch_size]
            pixels = augment(pixels_from_uint8(pixels_all[rows].to(device)), config.max_shift, config.flip, generator)
            ids = caption_ids[rows].to(device)
            image_emb, text_emb = model(pixels, text_features[ids])
            loss = clip_loss(image_emb, text_emb, model.logit_scale, ids)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            with torch.no_grad():
                model.logit_scale.clamp_(0.0, MAX_LOGIT_SCALE)
            losses.append(loss.detach())
            bar.update(1)
        record = {
            "epoch": epoch + 1,
            "loss": float(torch.stack(losses).mean()),
            "lr": float(scheduler.get_last_lr()[0]),
            "temperature": float(1 / model.logit_scale.detach().exp()),
            "seconds": time.perf_counter() - start,
        }
        if val is not None and val_features is not None:
            model.eval()
            with torch.no_grad():
                val_text = model.encode_text(val_features).cpu().numpy()
            val_images = encode_images_with(model, val[0], device)
            record["val_i2t_accuracy"] = retrieval_accuracy(val_images, list(val[1]), val_text, val_unique)
            record["val_chance"] = 1.0 / len(val_unique)
            model.train()
        bar.set_postfix(loss=f"{record['loss']:.3f}")
        logger.info("embedded model epoch %d/%d: %s", epoch + 1, config.epochs, ", ".join(f"{k}={v:.4g}" for k, v in record.items() if k != "epoch"))
        history.append(record)
    bar.close()
    return model.eval(), history


# --- the Encoder ---------------------------------------------------------------------------


def weights_digest(model: nn.Module) -> str:
    """sha256 (hex) of every parameter and buffer, in name order: the same before saving and after loading."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(str(tuple(tensor.shape)).encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class EmbeddedEncoder:
    """A trained `EmbeddedCLIP` plus MiniLM, behind the `Encoder` interface.

    MiniLM is loaded on the first `encode_texts` call unless given, so image-only use stays light.
    id = "embedded:" + first 12 hex digits of the weights' sha256 (`weights_digest`).
    """

    has_text: bool = True

    def __init__(self, model: EmbeddedCLIP, text_encoder: MiniLM | None = None, device: str | torch.device | None = None) -> None:
        self.device = resolve_device(device) if device is not None else next(model.parameters()).device
        self.model = model.to(self.device).eval()
        self._text_encoder = text_encoder
        self.dim = model.embed_dim
        self.image_size = model.image_size
        self.id = f"embedded:{weights_digest(model)[:12]}"

    @property
    def text_encoder(self) -> MiniLM:
        """The frozen MiniLM (loaded lazily)."""
        if self._text_encoder is None:
            self._text_encoder = MiniLM(self.device)
        return self._text_encoder

    def encode_images(self, images: np.ndarray, batch_size: int = 256) -> np.ndarray:
        """uint8 (n, H, W, 3) with H = W = the trained image size -> float32 (n, d), unit rows."""
        check_images(images, self.image_size)
        check_batch_size(batch_size)
        return encode_images_with(self.model, images, self.device, batch_size)

    def encode_texts(self, texts: list[str], batch_size: int = 256) -> np.ndarray:
        """n strings -> float32 (n, d), unit rows (MiniLM features through the learned projection)."""
        features = self.text_encoder.encode(texts, batch_size)
        with torch.no_grad():
            return self.model.encode_text(torch.from_numpy(features).to(self.device)).cpu().numpy()


# --- saving and loading ----------------------------------------------------------------------


def save_embedded(model: EmbeddedCLIP, config: EmbeddedConfig, directory: Path) -> None:
    """Write `model.safetensors` and `config.json` into `directory` (created if missing).

    Each file is written under a temporary name and renamed into place, so a crash never leaves a
    half-written file under the final name.
    """
    from safetensors.torch import save_file

    if (model.embed_dim, model.image_size) != (config.embed_dim, config.image_size):
        raise ValueError(f"config (embed_dim={config.embed_dim}, image_size={config.image_size}) does not match the model "
                         f"(embed_dim={model.embed_dim}, image_size={model.image_size})")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().cpu().contiguous() for name, t in model.state_dict().items()}
    meta = {
        "schema_version": SCHEMA_VERSION,
        "kind": "embedded",
        "config": dataclasses.asdict(config),
        "text_model": "all-MiniLM-L6-v2",
        "weights_sha256": weights_digest(model),
    }
    tmp_weights, tmp_config = directory / f".{WEIGHTS_FILE}.tmp", directory / f".{CONFIG_FILE}.tmp"
    save_file(state, str(tmp_weights))
    tmp_config.write_text(json.dumps(meta, indent=2))
    os.replace(tmp_weights, directory / WEIGHTS_FILE)
    os.replace(tmp_config, directory / CONFIG_FILE)


def read_embedded_config(directory: Path) -> tuple[EmbeddedConfig, dict[str, Any]]:
    """The saved EmbeddedConfig and the whole config.json, with clear errors for missing or foreign files."""
    path = Path(directory) / CONFIG_FILE
    if not Path(directory).is_dir():
        raise FileNotFoundError(f"{directory}: no embedded model directory here (expected {CONFIG_FILE} and {WEIGHTS_FILE})")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; not an embedded model directory (expected {CONFIG_FILE} next to {WEIGHTS_FILE})")
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from error
    if not isinstance(meta, dict) or meta.get("kind") != "embedded":
        raise ValueError(f"{path}: expected kind 'embedded', got {meta.get('kind') if isinstance(meta, dict) else type(meta).__name__!r}")
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {meta.get('schema_version')!r}, this code reads {SCHEMA_VERSION}")
    try:
        config = EmbeddedConfig(**meta["config"])
    except (KeyError, TypeError) as error:
        raise ValueError(f"{path}: 'config' does not describe an EmbeddedConfig ({error})") from error
    return config, meta


def load_embedded(directory: Path, device: str | torch.device = "cpu", text_encoder: MiniLM | None = None) -> EmbeddedEncoder:
    """Rebuild the encoder saved by `save_embedded`; its embeddings are identical to the saved model's.

    Raises FileNotFoundError for a missing directory or file, ValueError for a corrupt or mismatched one
    (unreadable safetensors, wrong tensors, or weights whose sha256 differs from the recorded one).
    """
    from safetensors.torch import load_file

    directory = Path(directory)
    config, meta = read_embedded_config(directory)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"{weights}: missing; the embedded model's weights are not here")
    try:
        state = load_file(str(weights), device="cpu")
    except Exception as error:  # safetensors raises its own error types for truncated/garbled files
        raise ValueError(f"{weights}: not a readable safetensors file ({error})") from error
    model = EmbeddedCLIP(config.embed_dim, config.width, config.image_size)
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        raise ValueError(f"{weights}: tensors do not match the architecture in {CONFIG_FILE} ({str(error).splitlines()[0]})") from error
    if weights_digest(model) != meta.get("weights_sha256"):
        raise ValueError(f"{weights}: weights sha256 differs from the one recorded in {CONFIG_FILE}; the checkpoint is corrupt")
    return EmbeddedEncoder(model, text_encoder, device=resolve_device(device))


# --- zero-shot evaluation ----------------------------------------------------------------------


def zero_shot_accuracy(
    encoder: Encoder,
    images: np.ndarray,
    attributes: np.ndarray,
    families: dict[str, list[int]],
    prompts: dict[str, list[str]],
) -> dict[str, dict[str, float]]:
    """Zero-shot classification accuracy per attribute family.

    images: held-out uint8 (n, H, W, 3). attributes: bool (n, A). families: family -> its attribute
    columns. prompts: family -> one prompt per column, in the same order. An image's prediction in a
    family is the prompt of highest cosine similarity; it counts against the true attribute, on the
    images where exactly one of the family's attributes is true (n, in the result; accuracy is NaN when
    n = 0). Returns family -> {"accuracy", "chance" (1 / family size), "n"}.
    """
    check_images(images)
    if not isinstance(attributes, np.ndarray) or attributes.dtype != np.bool_ or attributes.ndim != 2:
        raise TypeError(f"attributes: expected a bool array (n, A), got {getattr(attributes, 'dtype', type(attributes).__name__)} of shape {getattr(attributes, 'shape', None)}")
    if attributes.shape[0] != images.shape[0]:
        raise ValueError(f"attributes: expected {images.shape[0]} rows (one per image), got {attributes.shape[0]}")
    if not encoder.has_text:
        raise ValueError(f"encoder {encoder.id}: has no text side; zero-shot classification needs one")
    if set(families) != set(prompts):
        raise ValueError(f"prompts: expected exactly the families {sorted(families)}, got {sorted(prompts)}")
    for family, columns in families.items():
        if len(columns) < 2:
            raise ValueError(f"families[{family!r}]: expected at least 2 attribute columns, got {list(columns)}")
        if len(prompts[family]) != len(columns):
            raise ValueError(f"prompts[{family!r}]: expected {len(columns)} prompts (one per column), got {len(prompts[family])}")
        out_of_range = [c for c in columns if not 0 <= c < attributes.shape[1]]
        if out_of_range:
            raise ValueError(f"families[{family!r}]: columns {out_of_range} outside 0..{attributes.shape[1] - 1}")

    image_emb = encoder.encode_images(images)
    all_prompts = [p for family in families for p in prompts[family]]
    text_emb = encoder.encode_texts(all_prompts)
    result: dict[str, dict[str, float]] = {}
    offset = 0
    for family, columns in families.items():
        family_text = text_emb[offset : offset + len(columns)]
        offset += len(columns)
        labels = attributes[:, columns]
        valid = labels.sum(axis=1) == 1
        truth = np.argmax(labels[valid], axis=1)
        predicted = np.argmax(image_emb[valid] @ family_text.T, axis=1)
        n = int(valid.sum())
        result[family] = {"accuracy": float(np.mean(predicted == truth)) if n else float("nan"), "chance": 1.0 / len(columns), "n": n}
    return result
