"""The encoders' options (params.yaml `encoder:`): the embedded model's and a pretrained model's. Light (no torch),
so that params.yaml's schema loads without the models."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import model_validator

from pipeline.settings import Bool, Device, NonNegativeFloat, NonNegativeInt, PositiveInt, defaults_from, settings
from pipeline.training.options import TrainSettings

#: the loop settings of the embedded model: AdamW with weight decay, cosine to 0, no gradient clipping
EMBEDDED_TRAIN = TrainSettings(epochs=15, min_steps=0, batch_size=64, lr=3e-3, weight_decay=1e-4, warmup_frac=0.05, min_lr_frac=0.0,
                               grad_clip=0.0)


@settings
class EmbeddedSettings:
    """The embedded model (params.yaml `encoder:` with `kind: embedded`).

    embed_dim: shared image/text dimension d. width: channels of the first conv block (then 2w, 4w, 4w).
    shift: maximum random translation in pixels for augmentation (None -> image size // 16). flip: random
    horizontal flips; off by default because captions may name left/right. Colours are never augmented: colour
    is an attribute. text_init: "whitened" starts the text projection as the whitened top-d principal components of
    the training captions' MiniLM features (`whitened_text_init`, regulariser `text_whiten_eps` relative to the
    largest variance), "orthogonal" as random orthonormal rows. train_text: train the text projection too (off:
    a learnt projection drops the directions the young image tower cannot match yet, shape first, and the tower
    then gets no gradient towards them). negatives: "captions" ranks each image against every distinct training
    caption (`caption_set_loss`; one (u, 384) x (384, d) product per step), "batch" against the batch's only
    (`clip_loss`, the standard loss; for caption sets too large to embed every step). train: the loop's settings
    (`TrainSettings`; its `patience` and `init_samples` are unused: there is no early stopping). device: where it trains and embeds ("auto" = cuda when present). Training is
    bit-for-bit deterministic for a seed on CPU. The image size is the dataset's (`data.image_size`).
    """

    kind: Literal["embedded"] = "embedded"
    embed_dim: PositiveInt = 128
    width: PositiveInt = 24
    shift: NonNegativeInt | None = None
    flip: Bool = False
    text_init: Literal["whitened", "orthogonal"] = "whitened"
    text_whiten_eps: NonNegativeFloat = 0.03
    train_text: Bool = False
    negatives: Literal["captions", "batch"] = "captions"
    train: Annotated[TrainSettings, defaults_from(EMBEDDED_TRAIN)] = EMBEDDED_TRAIN
    device: Device = "auto"

    @property
    def dim(self) -> int:
        """The embedding dimension (what `pipeline.config` checks k against)."""
        return self.embed_dim

    def max_shift(self, image_size: int) -> int:
        """The augmentation's maximum translation in pixels at `image_size`."""
        return image_size // 16 if self.shift is None else self.shift


#: the keys each kind takes besides kind, dim and device
_KEYS = {"open_clip": ("arch", "weights", "arch_config"), "hf_clip": ("model",), "dinov2": ("model",), "blip": ("model",)}


@settings
class PretrainedSettings:
    """A pretrained image(-text) encoder.

    open_clip: `arch` (an open_clip architecture name) and `weights` (a pretrained tag of it, a local checkpoint
    file, or None for a randomly initialised model), optionally `arch_config` (a JSON architecture file named
    <arch>.json). hf_clip / dinov2 / blip: `model` (a hub id or a local folder). Offline, a hub id or tag that is not
    in the local cache fails at once with instructions. `dim` (optional) lets params.yaml be checked against the
    embedding dimension (k <= d) before the model is loaded.
    """

    kind: Literal["open_clip", "hf_clip", "dinov2", "blip"]
    arch: str | None = None
    weights: str | None = None
    arch_config: str | None = None
    model: str | None = None
    dim: PositiveInt | None = None
    device: Device = "auto"

    @model_validator(mode="after")
    def _keys_of_its_kind(self) -> "PretrainedSettings":
        wanted = _KEYS[self.kind]
        foreign = [k for k in ("arch", "weights", "arch_config", "model") if k not in wanted and getattr(self, k) is not None]
        if foreign:
            raise ValueError(f"{self.kind} does not take {', '.join(foreign)} (it takes {', '.join(wanted)})")
        if self.kind == "open_clip" and not self.arch:
            raise ValueError("open_clip needs `arch` (e.g. ViT-B-32) and usually `weights` (a tag or a local file)")
        if self.kind != "open_clip" and not self.model:
            raise ValueError(f"{self.kind} needs `model` (a hub id or a local folder)")
        return self
