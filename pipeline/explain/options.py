"""The explanations' options: the caption decoder's (params.yaml `captions:`) and what each evaluation explains
(`explain:`). Light (no torch), so that params.yaml's schema loads without the decoder."""

from __future__ import annotations

from typing import Annotated

from pydantic import model_validator

from pipeline.settings import Device, NonNegativeFloat, NonNegativeInt, OpenFraction, PositiveInt, defaults_from, settings
from pipeline.training.options import TrainSettings

#: the loop settings of the decoder: AdamW, cosine decay to 0, gradient norm clipped to 1
DECODER_TRAIN = TrainSettings(epochs=8, min_steps=0, batch_size=64, lr=2e-3, weight_decay=0.01, warmup_frac=0.05, min_lr_frac=0.0, grad_clip=1.0)


@settings
class DecoderSettings:
    """Architecture, augmentation and training of the caption decoder (params.yaml `captions:`).

    Architecture: `n_prefix` prefix tokens, `width` model width, `layers` pre-norm transformer blocks with `heads`
    heads and a GELU feed-forward of `ff_mult` x width, `dropout` inside the blocks, `max_tokens` token positions
    (<bos> + words; longer captions are cut, with a warning). Augmentation (see the module docstring): `drop_max`
    the largest fraction of coordinates (in a random basis) zeroed per sample, `noise_std` Gaussian noise on the
    standardised embedding; both 0 turn it off. Vocabulary: tokens seen fewer than `min_count` times become <unk>.
    train: the loop's settings (`TrainSettings`; no early stopping). device: "auto" = cuda when present.
    max_pairs: the captions stage trains on at most this many (embedding, caption) pairs of the training split (a
    seeded subsample; bounds its memory at max_pairs x d floats on large datasets).
    The defaults train on the default preset's 3,600 pairs in about a minute on 2 CPU cores.
    """

    n_prefix: PositiveInt = 4
    width: PositiveInt = 128
    layers: PositiveInt = 2
    heads: PositiveInt = 4
    ff_mult: PositiveInt = 2
    dropout: OpenFraction = 0.1
    max_tokens: PositiveInt = 32
    drop_max: OpenFraction = 0.5
    noise_std: NonNegativeFloat = 0.05
    min_count: PositiveInt = 1
    max_pairs: PositiveInt = 200_000
    train: Annotated[TrainSettings, defaults_from(DECODER_TRAIN)] = DECODER_TRAIN
    device: Device = "auto"

    @model_validator(mode="after")
    def _consistent(self) -> "DecoderSettings":
        if self.width % self.heads:
            raise ValueError(f"width ({self.width}) must be divisible by heads ({self.heads})")
        if self.max_tokens < 2:
            raise ValueError(f"max_tokens must be >= 2 (<bos> and one word), got {self.max_tokens}")
        return self


@settings
class ExplainSettings:
    """How much each evaluate stage explains (params.yaml `explain:`).

    top_names: concepts kept per latent. top_m: named concepts per image scored by relevance.
    caption_images: test images captioned per kind and source (dense, sparse reconstruction, top-k in the original
    basis); with 300 the explanations add about 1 s to an SAE's evaluate stage on the default preset.
    caption_ks: extra k at which rotation runs are captioned (a "describes the image" curve; only k <= d; SAEs use
    their own k); each k adds two sources, about 0.5 s on the default preset (bench/bench_captions.py).
    max_len: words per caption. latents: latents kept for the report (most frequently active first).
    top_images: top-activating test images per kept latent. examples: example images per kind.
    pairs: intervention pairs per kind. switched: latents listed per pair and direction (on / off).
    max_rows: test images per kind used at all (the seeded subsample bounds memory on large test splits).
    """

    top_names: PositiveInt = 5
    top_m: PositiveInt = 5
    caption_images: PositiveInt = 300
    caption_ks: tuple[PositiveInt, ...] = ()
    max_len: PositiveInt = 24
    latents: PositiveInt = 64
    top_images: PositiveInt = 6
    examples: NonNegativeInt = 8
    pairs: NonNegativeInt = 4
    switched: PositiveInt = 8
    max_rows: PositiveInt = 2000
