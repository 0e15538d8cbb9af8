"""The embedded offline vision-language model: a small CNN aligned to the frozen all-MiniLM-L6-v2 text encoder.

No CLIP weights exist offline, so the pipeline trains its own CLIP-like model on the procedural scenes.
The image tower (`EmbeddedCLIP`) is trained with the CLIP loss (symmetric InfoNCE, learnable temperature) against
the *frozen* MiniLM sentence embeddings of the captions, by the one training loop (`pipeline.training.loop`).
The text side is a linear map 384 -> d of MiniLM features: by default the whitened principal components of the
training captions' features, fixed (`whitened_text_init`); the image->text term ranks each image against every
training caption, not only the batch's (`caption_set_loss`). Because the text side is a pretrained language
model, any English word or phrase can later be embedded as a concept, not only the training captions.

Layout of a saved model directory (`save_embedded` / `load_embedded`):
    model.safetensors   every parameter and buffer of `EmbeddedCLIP` (no pickle)
    config.json         {"schema_version", "kind": "embedded", "settings": EmbeddedSettings fields, "image_size",
                         "text_model", "weights_sha256"}
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.atomic import atomic_file, write_text_atomic
from pipeline.encoders.base import check_batch_size, check_images, weights_digest
from pipeline.encoders.options import EmbeddedSettings
from pipeline.encoders.text import TEXT_DIM, MiniLM, check_texts
from pipeline.training.device import resolve_device
from pipeline.training.loop import BatchSource, Validation, fit

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 3  # 3: the text_mean buffer (MiniLM features are centred before the text projection)
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
MAX_LOGIT_SCALE = math.log(100.0)  # CLIP's clamp: temperature never below 1/100

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
    features minus `text_mean` (a buffer: the training captions' mean feature with the whitened initialisation,
    else 0), initialised with orthonormal rows (a plain subspace of MiniLM's space) until `whitened_text_init`
    sets it. Both outputs are L2-normalised. `logit_scale` is log(1 / temperature), initialised to log(1 / 0.07).
    """

    def __init__(self, embed_dim: int, width: int, image_size: int, text_dim: int = TEXT_DIM, negatives: str = "captions") -> None:
        super().__init__()
        self.negatives = negatives  # which captions the image->text term ranks against (a training option, not saved)
        self.embed_dim = int(embed_dim)
        self.image_size = int(image_size)  # the size it is trained for; encoders refuse other sizes
        self.text_dim = int(text_dim)
        w = int(width)
        self.tower = nn.Sequential(_conv_block(3, w, stride=2, pool=False), _conv_block(w, 2 * w), _conv_block(2 * w, 4 * w), _conv_block(4 * w, 4 * w))
        self.image_head = nn.Linear(4 * w, embed_dim)
        self.text_projection = nn.Linear(text_dim, embed_dim, bias=False)
        nn.init.orthogonal_(self.text_projection.weight)
        # subtracted from MiniLM features before the projection (the training captions' mean with text_init="whitened")
        self.register_buffer("text_mean", torch.zeros(text_dim))
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
        return F.normalize(self.text_projection(text_features - self.text_mean), dim=1)

    def forward(self, pixels: Tensor, text_features: Tensor) -> tuple[Tensor, Tensor]:
        """(image embeddings (n, d), text embeddings (m, d))."""
        return self.encode_image(pixels), self.encode_text(text_features)

    # --- training through pipeline.training.loop -----------------------------------------
    def training_loss(self, batch: tuple[Tensor, Tensor, Tensor], progress: float, generator: torch.Generator) -> tuple[Tensor, dict[str, Tensor]]:
        """CLIP loss of one batch: augmented pixels (b, 3, H, W), the MiniLM features of every distinct training
        caption (u, 384) and each image's caption row (b,). negatives "batch": the standard in-batch loss
        (`clip_loss`); "captions": the image->text term ranks against every training caption (`caption_set_loss`)."""
        pixels, caption_features, caption_ids = batch
        image_emb = self.encode_image(pixels)
        if self.negatives == "captions":
            loss = caption_set_loss(image_emb, self.encode_text(caption_features), self.logit_scale, caption_ids)
        else:
            loss = clip_loss(image_emb, self.encode_text(caption_features[caption_ids]), self.logit_scale, caption_ids)
        return loss, {"temperature": (1 / self.logit_scale.detach().exp())}

    def before_step(self) -> None:
        """Nothing to do before the optimiser step."""

    @torch.no_grad()
    def after_step(self) -> None:
        """Clamp the temperature to CLIP's range (logit scale in [0, log 100])."""
        self.logit_scale.clamp_(0.0, MAX_LOGIT_SCALE)


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


def caption_set_loss(image_emb: Tensor, caption_emb: Tensor, logit_scale: Tensor, caption_ids: Tensor) -> Tensor:
    """The CLIP loss with every caption of the training set as a negative for the image->text term.

    image_emb: (b, d) unit rows; caption_emb: (u, d) unit rows, one per distinct training caption; caption_ids:
    (b,) each image's row of caption_emb. image->text: cross-entropy of exp(logit_scale) * image_emb @
    caption_emb.T over all u captions (target: the image's caption); text->image: the in-batch term of
    `clip_loss` (each batch caption against the b images). The mean of the two.

    Why: with a frozen text tower the embeddings of all u captions cost one (u, 384) x (384, d) product per
    step, and ranking against all of them is far harder than against b - 1 random ones: among 64 random captions
    body colour, top colour and background already single out the right one, so once those are learnt an
    in-batch loss stops asking for shape, pattern, size and top shape; among thousands, captions that differ
    only in those words are always present.
    """
    if image_emb.ndim != 2 or caption_emb.ndim != 2 or image_emb.shape[1] != caption_emb.shape[1]:
        raise ValueError(f"caption_set_loss: expected image_emb (b, d) and caption_emb (u, d), got {tuple(image_emb.shape)} and {tuple(caption_emb.shape)}")
    if caption_ids.shape != (image_emb.shape[0],):
        raise ValueError(f"caption_set_loss: caption_ids must have shape ({image_emb.shape[0]},), got {tuple(caption_ids.shape)}")
    scale = logit_scale.exp()
    image_to_text = F.cross_entropy(scale * image_emb @ caption_emb.T, caption_ids)
    batch_text = caption_emb[caption_ids]
    same = (caption_ids[:, None] == caption_ids[None, :]).to(image_emb.dtype)
    targets = same / same.sum(dim=1, keepdim=True)
    text_to_image = -(targets * F.log_softmax(scale * batch_text @ image_emb.T, dim=1)).sum(dim=1).mean()
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


def build_embedded(embedded: EmbeddedSettings, image_size: int, seed: int) -> EmbeddedCLIP:
    """A freshly initialised model; the initialisation depends only on the seed (global RNG untouched)."""
    if image_size < 16:
        raise ValueError(f"image_size must be >= 16 (four 2x poolings), got {image_size}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return EmbeddedCLIP(embedded.embed_dim, embedded.width, image_size, negatives=embedded.negatives)


def contrastive_batches(images: np.ndarray, caption_ids: np.ndarray, text_features: Tensor, batch_size: int, seed: int,
                        max_shift: int, flip: bool) -> BatchSource:
    """Shuffled, augmented training batches (pixels float (b, 3, H, W), the MiniLM features of every distinct
    caption `text_features` (u, 384), each image's caption row (b,)).

    The last partial batch is dropped (a tiny batch is a weak contrastive signal); order and augmentation depend
    only on (seed, epoch). Images stay uint8 in memory and are converted per batch.
    """
    pixels_all = torch.from_numpy(np.ascontiguousarray(images))
    ids_all = torch.from_numpy(np.asarray(caption_ids, dtype=np.int64))
    n = len(images)

    def batches(epoch: int) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order = torch.randperm(n, generator=generator)
        for step in range(n // batch_size):
            rows = order[step * batch_size : (step + 1) * batch_size]
            pixels = augment(pixels_from_uint8(pixels_all[rows]), max_shift, flip, generator)
            ids = ids_all[rows]
            yield pixels, text_features, ids

    return batches


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


def whitened_text_init(model: EmbeddedCLIP, features: np.ndarray, eps: float) -> None:
    """Set the text projection to the whitened principal components of the training captions' MiniLM features.

    features: (n, 384), one row per training image (its caption's features). The projection becomes
    x -> (x - mean) V_d diag(1 / sqrt(lambda + eps * lambda_max)) for the top d = embed_dim principal
    directions V_d (variances lambda): every direction along which the captions vary starts with about
    equal weight, instead of MiniLM's own geometry, where the words that differ between captions of one
    template (a shape, a top, a size) move the sentence embedding far less than the template does. When
    d exceeds the features' dimension the extra rows keep their orthogonal initialisation.
    """
    x = np.asarray(features, dtype=np.float64)
    mean = x.mean(axis=0)
    variances, vectors = np.linalg.eigh(np.cov((x - mean).T))
    variances, vectors = np.clip(variances[::-1], 0.0, None), vectors[:, ::-1]
    k = min(model.embed_dim, x.shape[1])
    scale = 1.0 / np.sqrt(variances[:k] + eps * variances[0] + 1e-12)
    weight = (vectors[:, :k] * scale).T  # (k, 384)
    weight /= np.linalg.norm(weight, axis=1).mean()  # the scale is irrelevant after normalisation; keep O(1) entries
    with torch.no_grad():
        model.text_mean.copy_(torch.from_numpy(mean.astype(np.float32)))
        model.text_projection.weight[:k].copy_(torch.from_numpy(weight.astype(np.float32)))


def train_embedded(
    images: np.ndarray,
    captions: list[str],
    embedded: EmbeddedSettings,
    seed: int = 0,
    text_encoder: MiniLM | None = None,
    val: tuple[np.ndarray, list[str]] | None = None,
) -> tuple[EmbeddedCLIP, list[dict[str, float]]]:
    """Train the embedded model on uint8 images (n, S, S, 3) and their n captions; returns it (eval mode) and the
    per-epoch history of `pipeline.training.loop.fit` ("train_loss", "train_temperature", "lr", and with `val` =
    (images, captions) "val_i2t_accuracy" and "val_chance" = 1 / distinct val captions).

    The MiniLM features of the distinct captions are computed once (no grad) and kept in memory; MiniLM is never
    updated. CLIP loss with same-caption positives.
    """
    check_images(images)
    check_texts(captions, "captions")
    image_size = int(images.shape[1])
    if images.shape[2] != image_size:
        raise ValueError(f"images: expected square images, got {images.shape[1]}x{images.shape[2]}")
    if len(captions) != images.shape[0]:
        raise ValueError(f"captions: expected one caption per image ({images.shape[0]}), got {len(captions)}")
    batch_size = min(embedded.train.batch_size, images.shape[0])
    if batch_size < 2:
        raise ValueError(f"images: contrastive training needs batches of at least 2 images, got {images.shape[0]} images "
                         f"and batch_size {embedded.train.batch_size}")
    if val is not None:
        check_images(val[0], image_size, "val images")
        check_texts(val[1], "val captions")
        if len(val[1]) != val[0].shape[0]:
            raise ValueError(f"val captions: expected one caption per val image ({val[0].shape[0]}), got {len(val[1])}")
    device = resolve_device(embedded.device)
    text_encoder = text_encoder if text_encoder is not None else MiniLM(device)
    unique, inverse = np.unique(np.asarray(captions, dtype=object).astype(str), return_inverse=True)
    text_features = torch.from_numpy(text_encoder.encode([str(u) for u in unique]))  # (u, 384), frozen
    logger.info("embedded model: %d images, %d distinct captions, device %s", len(captions), len(unique), device)

    model = build_embedded(embedded, image_size, seed)
    if embedded.text_init == "whitened":
        whitened_text_init(model, text_features.numpy()[inverse.reshape(-1)], embedded.text_whiten_eps)
    model.text_projection.weight.requires_grad_(embedded.train_text)
    validation = None
    if val is not None:
        val_unique = sorted(set(val[1]))
        val_features = torch.from_numpy(text_encoder.encode(val_unique)).to(device)

        def run() -> dict[str, float]:
            val_text = model.encode_text(val_features).cpu().numpy()
            val_images = encode_images_with(model, val[0], device)
            return {"val_i2t_accuracy": retrieval_accuracy(val_images, list(val[1]), val_text, val_unique), "val_chance": 1.0 / len(val_unique)}

        validation = Validation(run=run)
    train = dataclasses.replace(embedded.train, batch_size=batch_size, device=embedded.device)
    batches = contrastive_batches(images, inverse.reshape(-1), text_features, batch_size, seed, embedded.max_shift(image_size), embedded.flip)
    result = fit(model, batches, images.shape[0] // batch_size, train, seed, validation, name="embedded model")
    return result.module, result.history  # type: ignore[return-value]


# --- the Encoder ---------------------------------------------------------------------------


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


def save_embedded(model: EmbeddedCLIP, embedded: EmbeddedSettings, directory: Path) -> None:
    """Write `model.safetensors` and `config.json` into `directory` (created if missing).

    Each file is written under a temporary name and renamed into place, so a crash never leaves a
    half-written file under the final name.
    """
    from safetensors.torch import save_file

    if model.embed_dim != embedded.embed_dim:
        raise ValueError(f"settings (embed_dim={embedded.embed_dim}) do not match the model (embed_dim={model.embed_dim})")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().cpu().contiguous() for name, t in model.state_dict().items()}
    meta = {
        "schema_version": SCHEMA_VERSION,
        "kind": "embedded",
        "settings": json.loads(json.dumps(dataclasses.asdict(embedded))),
        "image_size": model.image_size,
        "text_model": "all-MiniLM-L6-v2",
        "weights_sha256": weights_digest(model),
    }
    with atomic_file(directory / WEIGHTS_FILE) as tmp:
        save_file(state, str(tmp))
    write_text_atomic(directory / CONFIG_FILE, json.dumps(meta, indent=2))


def read_embedded_config(directory: Path) -> tuple[EmbeddedSettings, dict[str, Any]]:
    """The saved EmbeddedSettings and the whole config.json, with clear errors for missing or foreign files."""
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
        embedded = EmbeddedSettings(**meta["settings"])
        int(meta["image_size"])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path}: 'settings' and 'image_size' do not describe an embedded model ({str(error).splitlines()[0]})") from error
    return embedded, meta


def load_embedded(directory: Path, device: str | torch.device = "cpu", text_encoder: MiniLM | None = None) -> EmbeddedEncoder:
    """Rebuild the encoder saved by `save_embedded`; its embeddings are identical to the saved model's.

    Raises FileNotFoundError for a missing directory or file, ValueError for a corrupt or mismatched one
    (unreadable safetensors, wrong tensors, or weights whose sha256 differs from the recorded one).
    """
    from safetensors.torch import load_file

    directory = Path(directory)
    embedded, meta = read_embedded_config(directory)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"{weights}: missing; the embedded model's weights are not here")
    try:
        state = load_file(str(weights), device="cpu")
    except Exception as error:  # safetensors raises its own error types for truncated/garbled files
        raise ValueError(f"{weights}: not a readable safetensors file ({error})") from error
    model = EmbeddedCLIP(embedded.embed_dim, embedded.width, int(meta["image_size"]), negatives=embedded.negatives)
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        raise ValueError(f"{weights}: tensors do not match the architecture in {CONFIG_FILE} ({str(error).splitlines()[0]})") from error
    if weights_digest(model) != meta.get("weights_sha256"):
        raise ValueError(f"{weights}: weights sha256 differs from the one recorded in {CONFIG_FILE}; the checkpoint is corrupt")
    return EmbeddedEncoder(model, text_encoder, device=resolve_device(device))
