"""Automatic stand-ins for the published user studies, on data with ground-truth attributes.

- `relevance`: are an image's named concepts true of it? Per image, precision = fraction of its top-m
  named concepts that are true attributes of the image, recall = fraction of its true attributes that
  appear among them; both averaged over images. The same function scores sparse explanations
  (`naming.explain_images`) and the dense reference (`naming.dense_explanations`).
- `describes_image_rate`: does a generated caption describe the image? Each caption is parsed against
  the attribute vocabulary (which attributes it states); it describes the image when it states at
  least one attribute and everything it states is true. Which phrases state an attribute is the
  dataset's knowledge (`pipeline.data.phrases`: the scene world's caption synonyms, or the words of a
  real dataset's attribute names), passed in as `phrases`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.data.phrases import words

__all__ = [
    "Relevance", "relevance", "CaptionJudgement", "normalise_phrases", "stated_attributes", "describes_image_rate", "check_captions",
]



@dataclass(frozen=True)
class Relevance:
    """Mean precision and recall of top-m named concepts over images.

    precision: mean over all images (an empty explanation scores 0). recall: mean over the images
    with at least one true attribute. n_images: images scored. n_empty: images whose explanation
    named no concept. See `relevance` for the exact rules.
    """

    precision: float
    recall: float
    n_images: int
    n_empty: int


@dataclass(frozen=True)
class CaptionJudgement:
    """Result of `describes_image_rate`.

    rate: fraction of captions that describe their image. describes: bool (n,). stated: int64 (n,),
    distinct attributes each caption states. correct: int64 (n,), how many of those are true of the image.
    stated_matrix: bool (n, A), which attributes each caption states.
    """

    rate: float
    describes: np.ndarray
    stated: np.ndarray
    correct: np.ndarray
    stated_matrix: np.ndarray


# --- checks ------------------------------------------------------------------------------------
def _check_attributes(attributes: np.ndarray, attribute_names: list[str], n: int | None = None) -> tuple[np.ndarray, list[str]]:
    array = np.asarray(attributes)
    if array.dtype != np.bool_:
        raise TypeError(f"attributes: expected a bool array (n, A), got dtype {array.dtype}")
    if array.ndim != 2:
        raise ValueError(f"attributes: expected a 2-D array (n, A), got shape {array.shape}")
    if isinstance(attribute_names, str) or not isinstance(attribute_names, (list, tuple)):
        raise TypeError(f"attribute_names: expected a list of strings, got {type(attribute_names).__name__}")
    if len(attribute_names) == 0:
        raise ValueError("attribute_names: expected at least one attribute, got an empty list")
    if len(attribute_names) != array.shape[1]:
        raise ValueError(f"attribute_names: expected {array.shape[1]} names (one per attributes column), got {len(attribute_names)}")
    if len(set(attribute_names)) != len(attribute_names):
        raise ValueError("attribute_names: names must be unique")
    if n is not None and array.shape[0] != n:
        raise ValueError(f"attributes: expected {n} rows (one per explanation/caption), got {array.shape[0]}")
    return array, list(attribute_names)


# --- relevance of named concepts ---------------------------------------------------------------
def relevance(explanations: list[list[tuple[str, float]]], attributes: np.ndarray, attribute_names: list[str], m: int) -> Relevance:
    """Precision and recall of each image's top-m named concepts against its true attributes.

    explanations: per image, (name, score) pairs best first (from `explain_images` or
    `dense_explanations`); only the first m entries count. attributes: bool (n, A) ground truth;
    attribute_names: the A column names. A name that is not an attribute name counts as wrong.
    Per image: precision = true named entries / named entries (an image with an empty explanation
    gets 0: it explains nothing); recall = distinct true attributes named / true attributes (images
    without true attributes are left out of the recall mean; NaN if no image has one).
    """
    if not isinstance(explanations, (list, tuple)):
        raise TypeError(f"explanations: expected a list (one list of (name, score) per image), got {type(explanations).__name__}")
    attributes, names = _check_attributes(attributes, attribute_names, len(explanations))
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"m: expected an int >= 1, got {m!r}")
    n = len(explanations)
    if n == 0:
        raise ValueError("explanations: expected at least one image, got an empty list")
    column = {name: j for j, name in enumerate(names)}
    index = np.full((n, m), -1, dtype=np.int64)  # attribute column of each named entry, -1 = not an attribute
    counts = np.zeros(n, dtype=np.int64)
    for i, entries in enumerate(explanations):  # gathers names into an array; the scoring is vectorised
        if not isinstance(entries, (list, tuple)):
            raise TypeError(f"explanations[{i}]: expected a list of (name, score) pairs, got {type(entries).__name__}")
        chosen = [entry[0] for entry in entries[:m]]
        counts[i] = len(chosen)
        index[i, : len(chosen)] = [column.get(str(name), -1) for name in chosen]
    valid = index >= 0
    rows = np.broadcast_to(np.arange(n)[:, None], index.shape)
    is_true = valid & attributes[rows, np.where(valid, index, 0)]
    precision = np.where(counts > 0, is_true.sum(1) / np.maximum(counts, 1), 0.0)
    named = np.zeros_like(attributes)
    named[rows[valid], index[valid]] = True
    n_true = attributes.sum(1)
    has_true = n_true > 0
    recall = (named & attributes).sum(1)[has_true] / n_true[has_true]
    return Relevance(
        precision=float(precision.mean()),
        recall=float(recall.mean()) if has_true.any() else float("nan"),
        n_images=n,
        n_empty=int((counts == 0).sum()),
    )


# --- does a caption describe the image? ---------------------------------------------------------
def normalise_phrases(phrases: list[list[str]], n_attributes: int) -> list[list[str]]:
    """Each attribute's phrases as space-joined lower-case words (`pipeline.data.phrases.words`), duplicates and
    empty phrases dropped; a clear error unless there is one list of strings per attribute."""
    if not isinstance(phrases, (list, tuple)) or len(phrases) != n_attributes:
        raise ValueError(f"phrases: expected one list of phrases per attribute ({n_attributes}), got {len(phrases) if isinstance(phrases, (list, tuple)) else type(phrases).__name__}")
    out = []
    for j, options in enumerate(phrases):
        if isinstance(options, str) or not all(isinstance(p, str) for p in options):
            raise TypeError(f"phrases[{j}]: expected a list of strings")
        out.append([p for p in dict.fromkeys(" ".join(words(p)) for p in options) if p])
    return out


def stated_attributes(captions: list[str], phrases: list[list[str]]) -> np.ndarray:
    """bool (n, A): which attributes each caption states, by longest-phrase-first matching on words.

    Scanning a caption left to right, the longest phrase that matches at the current word wins and
    its words are consumed, so "a blue circle in a blue sky" states "blue" (a body colour) once and
    "blue sky" (the sky background) once, and "night sky" is never read as "sky". A phrase shared by
    two attributes states both. Words that match no phrase are ignored.
    """
    table: dict[tuple[str, ...], list[int]] = {}
    for j, attribute_phrases_ in enumerate(phrases):
        for phrase in attribute_phrases_:
            table.setdefault(tuple(phrase.split()), []).append(j)
    if not table:
        raise ValueError("phrases: no phrase to match; the attribute vocabulary is empty")
    longest = max(len(key) for key in table)
    out = np.zeros((len(captions), len(phrases)), dtype=bool)
    for i, caption in enumerate(captions):  # text parsing is inherently per caption
        tokens = words(caption)
        position = 0
        while position < len(tokens):
            for length in range(min(longest, len(tokens) - position), 0, -1):
                hit = table.get(tuple(tokens[position:position + length]))
                if hit is not None:
                    out[i, hit] = True
                    position += length
                    break
            else:
                position += 1
    return out


def check_captions(captions: list[str]) -> None:
    """A clear error unless `captions` is a non-empty list of strings."""
    if isinstance(captions, str) or not isinstance(captions, (list, tuple)):
        raise TypeError(f"captions: expected a list of strings, got {type(captions).__name__}")
    if len(captions) == 0:
        raise ValueError("captions: expected at least one caption, got an empty list")
    bad = next((i for i, c in enumerate(captions) if not isinstance(c, str)), None)
    if bad is not None:
        raise TypeError(f"captions[{bad}]: expected a string, got {type(captions[bad]).__name__}")


def describes_image_rate(captions: list[str], attributes: np.ndarray, attribute_names: list[str], phrases: list[list[str]]) -> CaptionJudgement:
    """How often a caption describes its image: it states >= 1 attribute and all it states is true.

    captions: n generated captions; attributes: bool (n, A) ground truth of the images;
    attribute_names: A names; phrases: per attribute, the phrases that state it in a caption (the dataset's
    knowledge: `pipeline.data.phrases`, recorded in the dataset's meta.json).
    Returns the rate and the per-caption counts (`CaptionJudgement`).
    """
    check_captions(captions)
    attributes, names = _check_attributes(attributes, attribute_names, len(captions))
    stated_matrix = stated_attributes(list(captions), normalise_phrases(phrases, len(names)))
    stated = stated_matrix.sum(1).astype(np.int64)
    correct = (stated_matrix & attributes).sum(1).astype(np.int64)
    describes = (stated > 0) & (correct == stated)
    return CaptionJudgement(rate=float(describes.mean()), describes=describes, stated=stated, correct=correct, stated_matrix=stated_matrix)
