"""Zero-shot classification accuracy of any encoder with a text tower, per attribute family."""

from __future__ import annotations

import numpy as np

from pipeline.encoders.base import Encoder, check_images


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
    n = 0). Returns family -> {"accuracy", "chance" (1 / family size), "n", "confusion"}: the confusion matrix is
    (k, k) counts, row = true value, column = predicted, in the family's column order.
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
        k = len(columns)
        confusion = np.bincount(truth * k + predicted, minlength=k * k).reshape(k, k)
        result[family] = {"accuracy": float(np.mean(predicted == truth)) if n else float("nan"), "chance": 1.0 / k, "n": n,
                          "confusion": confusion.tolist()}
    return result
