"""BLIP captions through `transformers` (for users with BLIP weights): the full model on images, or its text decoder
on a (sparsely reconstructed) vision embedding sequence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor


def _load_blip(model_or_path: Any) -> Any:
    from transformers import BlipForConditionalGeneration

    if isinstance(model_or_path, BlipForConditionalGeneration):
        return model_or_path
    if isinstance(model_or_path, (str, Path)):
        path = Path(model_or_path)
        if not path.is_dir():
            raise FileNotFoundError(f"model_or_path: {path} is not a local BLIP folder (download it with network access first; "
                                    "no model hub here)")
        return BlipForConditionalGeneration.from_pretrained(str(path), local_files_only=True)
    raise TypeError(f"model_or_path: expected a BlipForConditionalGeneration or a local folder, got {type(model_or_path).__name__}")


@torch.no_grad()
def blip_image_embeddings(model_or_path: Any, pixel_values: Any) -> np.ndarray:
    """BLIP's vision sequence for preprocessed images (n, 3, H, W): float32 (n, S, H_vision).

    This is what BLIP's text decoder cross-attends to; sparsify it (per token) and pass the
    reconstruction to `blip_captions`.
    """
    model = _load_blip(model_or_path).eval()
    device = next(model.parameters()).device
    pixels = torch.as_tensor(np.asarray(pixel_values) if not isinstance(pixel_values, Tensor) else pixel_values, dtype=torch.float32)
    if pixels.ndim != 4 or pixels.shape[1] != 3:
        raise ValueError(f"pixel_values: expected (n, 3, H, W), got shape {tuple(pixels.shape)}")
    return model.vision_model(pixel_values=pixels.to(device))[0].float().cpu().numpy()


@torch.no_grad()
def blip_captions(
    model_or_path: Any,
    embeddings_or_images: Any,
    tokenizer: Any = None,
    max_new_tokens: int = 20,
    num_beams: int = 1,
    batch_size: int = 32,
) -> list[str]:
    """Captions from BLIP (`transformers.BlipForConditionalGeneration`, a model or a local folder).

    embeddings_or_images, by number of dimensions:
    - 4: preprocessed pixel values (n, 3, H, W): the full model (vision tower + text decoder);
    - 3: a vision embedding sequence (n, S, H_vision) (`blip_image_embeddings`, or its sparse
      reconstruction): the text decoder cross-attends to it directly;
    - 2: one vector per image (n, H_vision), read as a sequence of length 1.
    tokenizer: anything with `batch_decode`; None loads the tokenizer saved in the model's folder.
    Greedy (num_beams = 1) or beam search; batched `batch_size` images at a time.
    """
    model = _load_blip(model_or_path).eval()
    if tokenizer is None:
        source = model_or_path if isinstance(model_or_path, (str, Path)) else getattr(model.config, "_name_or_path", "")
        if not source or not Path(source).is_dir():
            raise ValueError("tokenizer: pass one (anything with batch_decode); the model has no local folder to load it from")
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    values = embeddings_or_images if isinstance(embeddings_or_images, Tensor) else torch.as_tensor(np.asarray(embeddings_or_images))
    if not values.is_floating_point():
        raise TypeError(f"embeddings_or_images: expected floats, got dtype {values.dtype}")
    if values.ndim == 2:
        values = values[:, None, :]
    if values.ndim not in (3, 4) or values.shape[0] == 0:
        raise ValueError(f"embeddings_or_images: expected (n, 3, H, W), (n, S, H) or (n, H) with n >= 1, got shape {tuple(values.shape)}")
    if not torch.isfinite(values).all():
        raise ValueError("embeddings_or_images: contains NaN or infinite values")
    hidden = model.config.vision_config.hidden_size
    if values.ndim == 3 and values.shape[2] != hidden:
        raise ValueError(f"embeddings_or_images: expected embeddings of width {hidden} (BLIP's vision hidden size), got shape {tuple(values.shape)}")
    device = next(model.parameters()).device
    text = model.config.text_config
    out: list[str] = []
    for start in range(0, values.shape[0], batch_size):
        chunk = values[start:start + batch_size].to(device=device, dtype=torch.float32)
        if chunk.ndim == 4:
            ids = model.generate(pixel_values=chunk, max_new_tokens=max_new_tokens, num_beams=num_beams, do_sample=False)
        else:
            prompt = torch.full((chunk.shape[0], 1), text.bos_token_id, dtype=torch.long, device=device)
            ids = model.text_decoder.generate(
                input_ids=prompt,
                eos_token_id=text.sep_token_id,
                pad_token_id=text.pad_token_id,
                encoder_hidden_states=chunk,
                encoder_attention_mask=torch.ones(chunk.shape[:2], dtype=torch.long, device=device),
                max_new_tokens=max_new_tokens,
                num_beams=num_beams,
                do_sample=False,
            )
        out.extend(s.strip() for s in tokenizer.batch_decode(ids, skip_special_tokens=True))
    return out
