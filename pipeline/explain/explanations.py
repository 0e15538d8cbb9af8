"""The explanations of one trained run, as the evaluate stage writes them (explain.json) and the report reads them.

Pure: arrays and models in, JSON-able dicts out, no file I/O (the stages read and write). Built on the
`pipeline.explain` library (docs/science.md §1, interpretability modes):

- latent names: every latent (a half-axis +i / -i of a rotation model, a decoder direction of an SAE) is
  named by its `top_names` most cosine-similar vocabulary concepts (text embeddings centred by the text
  mean: the modality gap). Only the `latents` most frequently active latents on the test images are kept
  (with their top-activating test images, their activations there, an activation histogram and the attribute of
  each kind they match best: `pipeline.explain.cards`) so that the report stays small; `naming_floor` is the cosine
  random directions reach under the same naming;
- relevance (kinds whose labels are complete, i.e. every attribute family one-hot, like `objects`: on a
  multi-label kind the labels omit e.g. the background, so a true concept would count as wrong):
  precision and recall of each test image's top-m named concepts against its true attributes, for the
  model's active latents and for the dense embedding's nearest concepts (the reference);
- captions of a subsample of test images from three sources (the dense embedding, the model's sparse
  reconstruction at its k, top-k in the original basis at the same k), the rate at which they "describe the
  image" and the fraction of the attributes they state that are true (`stated_precision`); rotation runs
  also at every k of `caption_ks` (one rotation serves every k);
- example images (concept explanation and the three captions) and intervention pairs with the latents
  whose binarised activation switched on or off.

Row subsampling is seeded and identical for every run, so the report can put the runs' explanations of the
same example image side by side.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from scipy import sparse

from pipeline.explain.caption_sources import topk_original_basis
from pipeline.explain.cards import activation_stats, best_attributes, naming_floor
from pipeline.explain.decoder import CaptionDecoder, decode_captions
from pipeline.explain.naming import LatentNames, dense_explanations, explain_images, latent_directions, name_latents
from pipeline.explain.options import ExplainSettings
from pipeline.explain.relevance import CaptionJudgement, describes_image_rate, relevance
from pipeline.metrics.csr import column_counts, stack_rows, to_csr
from pipeline.models.base import SparseModel
from pipeline.records import json_number

log = logging.getLogger(__name__)

__all__ = [
    "SOURCES", "ExplainSettings", "KindData", "Concepts", "latent_labels", "explain_rows", "frequent_latents",
    "top_activating", "latent_list", "switched_latents", "explain_run", "stated_precision",
]

#: latent activations (n, L): a dense numpy array or a scipy.sparse matrix
Codes = np.ndarray | sparse.sparray | sparse.spmatrix

#: the caption sources, in the order the report shows them
SOURCES = ("dense", "sparse", "topk_original")


@dataclass
class KindData:
    """One kind of scene's test images and intervention pairs (numpy arrays, rows aligned).

    rows: int64 (n,) dataset rows of the test images (already subsampled: `explain_rows`). x: float32 (n, d).
    attributes: bool (n, A) the kind's label columns; attribute_names: their A names; phrases: per attribute, the
    phrases that state it in a caption (the dataset's, `pipeline.data.phrases`); families: family ->
    kind-local columns. truth: the dataset's caption of each image. scored: whether the labels are complete
    (relevance is computed). pair_ids: int64 (p,) dataset pair indices; pairs_before / pairs_after: float32
    (p, d) embeddings; pair_edits: p edit descriptions ("red body -> blue body").
    caption_attributes / caption_names / caption_phrases: the labels captions are judged against (None:
    attributes, attribute_names, phrases). A kind with complete labels may add the other kinds' columns,
    which are false on its rows, so that a caption stating e.g. "a tree" on a single-object scene is wrong
    rather than ignored; a multi-label kind must not (its rows leave e.g. the background unlabelled).
    codes: the model's latent activations of these rows (CSR (n, n_half_latents)) when already computed (the
    evaluation reads them from its code set); None: `explain_run` encodes x.
    """

    kind: str
    rows: np.ndarray
    x: np.ndarray
    attributes: np.ndarray
    attribute_names: list[str]
    families: dict[str, list[int]]
    phrases: list[list[str]]
    truth: list[str]
    scored: bool
    pair_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    pairs_before: np.ndarray | None = None
    pairs_after: np.ndarray | None = None
    pair_edits: list[str] = field(default_factory=list)
    caption_attributes: np.ndarray | None = None
    caption_names: list[str] | None = None
    caption_phrases: list[list[str]] | None = None
    codes: sparse.csr_array | None = None

    def __post_init__(self) -> None:
        n = len(self.rows)
        if n == 0:
            raise ValueError(f"{self.kind}: expected at least one test image, got none")
        if self.x.ndim != 2 or self.x.shape[0] != n:
            raise ValueError(f"{self.kind}: x: expected shape ({n}, d) (one row per test image), got {self.x.shape}")
        if self.attributes.dtype != np.bool_ or self.attributes.shape != (n, len(self.attribute_names)):
            raise ValueError(f"{self.kind}: attributes: expected bool ({n}, {len(self.attribute_names)}), got {self.attributes.dtype} {self.attributes.shape}")
        if len(self.truth) != n:
            raise ValueError(f"{self.kind}: truth: expected {n} captions, got {len(self.truth)}")
        p = len(self.pair_ids)
        for name in ("pairs_before", "pairs_after"):
            value = getattr(self, name)
            if p and (value is None or value.shape != (p, self.x.shape[1])):
                raise ValueError(f"{self.kind}: {name}: expected shape ({p}, {self.x.shape[1]}), got {None if value is None else value.shape}")
        if self.codes is not None and self.codes.shape[0] != n:
            raise ValueError(f"{self.kind}: codes: expected {n} rows (one per test image), got {self.codes.shape}")
        if len(self.pair_edits) != p:
            raise ValueError(f"{self.kind}: pair_edits: expected {p} descriptions, got {len(self.pair_edits)}")
        given = [v is not None for v in (self.caption_attributes, self.caption_names, self.caption_phrases)]
        if any(given) and not all(given):
            raise ValueError(f"{self.kind}: caption_attributes, caption_names and caption_phrases go together (all or none)")
        if all(given) and (self.caption_attributes.dtype != np.bool_ or self.caption_attributes.shape != (n, len(self.caption_names))):
            raise ValueError(f"{self.kind}: caption_attributes: expected bool ({n}, {len(self.caption_names)}), "
                             f"got {self.caption_attributes.dtype} {self.caption_attributes.shape}")

    def caption_labels(self) -> tuple[np.ndarray, list[str], list[list[str]]]:
        """(attributes (n, A'), names, phrases) that captions are judged against."""
        if self.caption_attributes is None:
            return self.attributes, self.attribute_names, self.phrases
        return self.caption_attributes, list(self.caption_names or []), list(self.caption_phrases or [])


@dataclass(frozen=True)
class Concepts:
    """The concept vocabulary: texts (C,) and their text embeddings float32 (C, d); centred by their mean."""

    texts: list[str]
    embeddings: np.ndarray

    @property
    def text_mean(self) -> np.ndarray:
        return self.embeddings.astype(np.float64).mean(axis=0)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


# --- small pure helpers ------------------------------------------------------------------------
def latent_labels(n_latents: int, signed: bool) -> list[str]:
    """Display names of the latents in `SparseModel.latents()` order: signed models "+0".."+{n-1}", then
    "-0".."-{n-1}" (the half-axes); others "0".."{n-1}"."""
    if not _is_int(n_latents) or n_latents < 1:
        raise ValueError(f"n_latents: expected an int >= 1, got {n_latents!r}")
    if signed:
        return [f"+{i}" for i in range(n_latents)] + [f"-{i}" for i in range(n_latents)]
    return [str(i) for i in range(n_latents)]


def explain_rows(n: int, size: int, seed: int) -> np.ndarray:
    """int64 positions of a seeded random order of n rows, the first `size` of it (all n if size >= n).

    The order is kept (not sorted): its first rows are the caption subsample and the example images, so
    they are a random sample too. Same n, size and seed give the same rows in every run.
    """
    if not _is_int(n) or n < 0:
        raise ValueError(f"n: expected an int >= 0, got {n!r}")
    if not _is_int(size) or size < 1:
        raise ValueError(f"size: expected an int >= 1, got {size!r}")
    return np.random.default_rng(seed).permutation(n)[: min(size, n)].astype(np.int64)


def _non_negative(name: str, codes: Codes) -> sparse.csr_array:
    """Non-negative float activations (n, L), dense or sparse, as CSR (only the active entries stored)."""
    if not (sparse.issparse(codes) or isinstance(codes, np.ndarray)) or codes.ndim != 2 or codes.dtype.kind != "f":
        raise ValueError(f"{name}: expected a float array (n, L), got {getattr(codes, 'dtype', type(codes))} {getattr(codes, 'shape', '')}")
    x = to_csr(name, codes, allow_empty=True)
    if not np.isfinite(x.data).all() or (x.data < 0).any():
        raise ValueError(f"{name}: expected finite non-negative activations (model.latents(codes))")
    return x


def frequent_latents(codes_latents: Codes, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The `count` most frequently active latents (activation > 0), most frequent first, ties by lower index.

    codes_latents: (n, L) non-negative activations, dense or sparse. Never-active latents are left out. Returns the
    latent indices int64 (<= count,) and the activation frequency of every latent float64 (L,).
    """
    codes = _non_negative("codes_latents", codes_latents)
    if not _is_int(count) or count < 1:
        raise ValueError(f"count: expected an int >= 1, got {count!r}")
    frequency = column_counts(codes) / codes.shape[0] if codes.shape[0] else np.zeros(codes.shape[1])
    order = np.argsort(-frequency, kind="stable")
    order = order[frequency[order] > 0][:count]
    return order.astype(np.int64), frequency


def top_activating(codes_latents: Codes, latents: np.ndarray, count: int) -> list[list[int]]:
    """For each latent of `latents`, the positions (rows of codes_latents) of its `count` largest
    activations, largest first, ties by lower row; only rows where it is active (> 0). Codes dense or sparse."""
    codes = _non_negative("codes_latents", codes_latents)
    latents = np.asarray(latents, dtype=np.int64)
    if not _is_int(count) or count < 1:
        raise ValueError(f"count: expected an int >= 1, got {count!r}")
    if len(latents) == 0 or codes.shape[0] == 0:
        return [[] for _ in latents]
    columns = sparse.csc_array(codes[:, latents])  # (n, S): each selected latent's active rows
    column = np.repeat(np.arange(len(latents)), np.diff(columns.indptr))
    order = np.lexsort((columns.indices, -columns.data, column))  # by latent, then activation down, then row up
    rows, column = columns.indices[order], column[order]
    rank = np.arange(len(order)) - np.repeat(columns.indptr[:-1], np.diff(columns.indptr))
    keep = rank < count
    return [rows[keep & (column == j)].tolist() for j in range(len(latents))]


def latent_list(codes_latents: Codes, rows: np.ndarray, names: LatentNames, labels: list[str], count: int, images: int) -> list[dict[str, Any]]:
    """The report's browsable latents: the `count` most frequently active latents with their names, name
    scores, activation frequency, the dataset rows (`rows`, one per row of codes_latents) of their
    `images` top-activating images, and (`pipeline.explain.cards.activation_stats`) their activations on those
    images and histogram."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) != codes_latents.shape[0]:
        raise ValueError(f"rows: expected {codes_latents.shape[0]} dataset rows (one per row of codes_latents), got {len(rows)}")
    if len(labels) != names.names.shape[0] or codes_latents.shape[1] != len(labels):
        raise ValueError(f"labels: expected {codes_latents.shape[1]} labels and names (one per latent), "
                         f"got {len(labels)} and {names.names.shape[0]}")
    chosen, frequency = frequent_latents(codes_latents, count)
    tops = top_activating(codes_latents, chosen, images)
    return [
        {"latent": labels[i], "index": int(i), "names": [str(s) for s in names.names[i]], "scores": [float(s) for s in names.scores[i]],
         "frequency": float(frequency[i]), "top_images": rows[top].tolist(), **stats}
        for i, top, stats in zip(chosen, tops, activation_stats(codes_latents, chosen, tops))
    ]


def switched_latents(before: Codes, after: Codes, labels: list[str], best_names: list[str], limit: int) -> list[dict[str, list[dict[str, Any]]]]:
    """Per pair, the latents whose binarised activation changed: "on" (inactive before, active after;
    largest activation after first) and "off" (active before, inactive after; largest before first),
    at most `limit` each, ties by lower latent index. before, after: (p, L) non-negative activations, dense or
    sparse (a few pairs: densified)."""
    before, after = _non_negative("before", before).toarray(), _non_negative("after", after).toarray()
    if before.shape != after.shape:
        raise ValueError(f"after: expected the shape of before {before.shape}, got {after.shape}")
    if len(labels) != before.shape[1] or len(best_names) != before.shape[1]:
        raise ValueError(f"labels/best_names: expected {before.shape[1]} (one per latent), got {len(labels)} and {len(best_names)}")
    if not _is_int(limit) or limit < 1:
        raise ValueError(f"limit: expected an int >= 1, got {limit!r}")

    def listed(mask: np.ndarray, strength: np.ndarray) -> list[list[dict[str, Any]]]:
        order = np.argsort(-np.where(mask, strength, -1.0), axis=1, kind="stable")[:, :limit]
        out = []
        for row, count in zip(order, mask.sum(axis=1)):  # a few pairs: builds the JSON lists
            out.append([{"latent": labels[i], "name": best_names[i]} for i in row[: min(count, limit)]])
        return out

    on = listed((after > 0) & ~(before > 0), after)
    off = listed((before > 0) & ~(after > 0), before)
    return [{"on": a, "off": b} for a, b in zip(on, off)]


# --- the whole run -------------------------------------------------------------------------------
@torch.no_grad()
def _reconstruct(model: SparseModel, x: np.ndarray, k: int) -> np.ndarray:
    return np.asarray(model.decode(model.encode(np.asarray(x, dtype=np.float32), int(k))), dtype=np.float32)


def stated_precision(judgement: CaptionJudgement) -> float | None:
    """The fraction of all attributes the captions state that are true of their images (pooled over captions;
    None if no caption states any). A softer companion of the "describes the image" rate, which needs every
    stated attribute right: with seven attributes per object caption, one wrong family fails the caption."""
    stated = int(judgement.stated.sum())
    return None if stated == 0 else float(judgement.correct.sum()) / stated


def _pairs(items: list[tuple[str, float]]) -> list[list[Any]]:
    return [[str(name), float(score)] for name, score in items]


def explain_run(
    model: SparseModel,
    k: int,
    decoder: CaptionDecoder,
    kinds: list[KindData],
    concepts: Concepts | None,
    image_mean: np.ndarray,
    settings: ExplainSettings,
) -> dict[str, Any]:
    """Every explanation of one run (the content of explain.json), see the module docstring.

    k: the run's k (its sparse reconstruction and the original-basis top-k use it). concepts: None when the
    encoder has no text tower: latents are then unnamed (empty names) and relevance is skipped; captions
    still work (the decoder reads any embedding). image_mean: (d,) the mean training embedding (centres
    the dense embedding for its nearest concepts and the original-basis top-k).
    """
    if not isinstance(model, SparseModel):
        raise TypeError(f"model: expected a SparseModel, got {type(model).__name__}")
    if not kinds:
        raise ValueError("kinds: expected at least one kind of test images, got none")
    if not _is_int(k) or not 1 <= k <= model.n_latents:
        raise ValueError(f"k: expected an int in 1..{model.n_latents} (the model's latents), got {k!r}")
    image_mean = np.asarray(image_mean, dtype=np.float32)
    if image_mean.shape != (model.d,):
        raise ValueError(f"image_mean: expected shape ({model.d},), got {image_mean.shape}")
    for data in kinds:
        if data.x.shape[1] != model.d:
            raise ValueError(f"{data.kind}: x: expected {model.d} columns (the model's d), got {data.x.shape}")
    labels = latent_labels(model.n_latents, model.signed)
    if concepts is not None:
        top_names = min(settings.top_names, len(concepts.texts))
        names = name_latents(latent_directions(model), concepts.embeddings, list(concepts.texts), top=top_names, text_mean=concepts.text_mean)
    else:
        empty = np.zeros((len(labels), 0))
        names = LatentNames(names=empty.astype(object), scores=empty.astype(np.float32), indices=empty.astype(np.int64))
    best = names.best if names.names.shape[1] else [""] * len(labels)

    codes = {data.kind: data.codes if data.codes is not None else model.sparse_latents(data.x) for data in kinds}
    all_codes = stack_rows([codes[data.kind] for data in kinds], model.n_half_latents)
    all_rows = np.concatenate([data.rows for data in kinds])
    result: dict[str, Any] = {
        "k": int(k), "signed": bool(model.signed), "n_latents": len(labels), "named": concepts is not None,
        "settings": {**asdict(settings), "caption_ks": list(settings.caption_ks)},
        "latents": latent_list(all_codes, all_rows, names, labels, settings.latents, settings.top_images),
        "relevance": {}, "describes": {}, "describes_curve": [], "examples": [], "pairs": [],
    }

    if concepts is not None:  # the cosine random directions reach: a name scoring near it says little
        result["naming_floor"] = naming_floor(concepts.embeddings, list(concepts.texts), concepts.text_mean)
    kept = np.asarray([latent["index"] for latent in result["latents"]], dtype=np.int64)
    for data in kinds:  # each kept latent's best-matching attribute of each kind (test F1 of the latent alone)
        best_column, f1 = best_attributes(codes[data.kind] > 0, data.attributes, kept)
        for latent, column, score in zip(result["latents"], best_column, f1):
            latent.setdefault("matches", {})[data.kind] = [data.attribute_names[column], float(score)] if score > 0 else None

    caption_ks = sorted({int(k), *(c for c in settings.caption_ks if c <= model.n_latents)}) if model.signed else [int(k)]
    for data in kinds:
        explanation = explain_images(codes[data.kind], names, top=settings.top_m) if concepts is not None else [[] for _ in data.rows]
        dense = (dense_explanations(data.x, image_mean, concepts.embeddings, list(concepts.texts), top=min(settings.top_m, len(concepts.texts)),
                                    text_mean=concepts.text_mean) if concepts is not None else [[] for _ in data.rows])
        if concepts is not None and data.scored:
            scores = {source: relevance(expl, data.attributes, data.attribute_names, settings.top_m)
                      for source, expl in (("model", explanation), ("dense", dense))}
            result["relevance"][data.kind] = {"m": settings.top_m, **{s: {key: json_number(v) for key, v in asdict(r).items()} for s, r in scores.items()}}

        n_cap = min(settings.caption_images, len(data.rows))
        labels_all, names_cap, phrases_cap = data.caption_labels()
        x_cap, truth = data.x[:n_cap], labels_all[:n_cap]
        captions: dict[tuple[str, int], list[str]] = {("dense", 0): decode_captions(decoder, x_cap, settings.max_len)}
        for kk in caption_ks:
            captions[("sparse", kk)] = decode_captions(decoder, _reconstruct(model, x_cap, kk), settings.max_len)
            captions[("topk_original", kk)] = decode_captions(decoder, topk_original_basis(x_cap, image_mean, kk), settings.max_len)
        judged = {key: describes_image_rate(text, truth, names_cap, phrases_cap) for key, text in captions.items()}
        keys = {"dense": ("dense", 0), "sparse": ("sparse", k), "topk_original": ("topk_original", k)}
        result["describes"][data.kind] = {"n_images": n_cap, "k": int(k), **{source: judged[key].rate for source, key in keys.items()},
                                          "attribute_precision": {source: stated_precision(judged[key]) for source, key in keys.items()}}
        if model.signed:
            result["describes_curve"] += [{"kind": data.kind, "k": kk, "source": source, "rate": judged[(source, kk)].rate,
                                           "attribute_precision": stated_precision(judged[(source, kk)])}
                                          for kk in caption_ks for source in ("sparse", "topk_original")]

        for i in range(min(settings.examples, n_cap)):
            result["examples"].append({
                "kind": data.kind, "row": int(data.rows[i]), "truth": data.truth[i],
                "attributes": [data.attribute_names[j] for j in np.flatnonzero(data.attributes[i])],
                "concepts": _pairs(explanation[i]), "dense_concepts": _pairs(dense[i]),
                "captions": {source: captions[key][i] for source, key in keys.items()},
                "describes": {source: bool(judged[key].describes[i]) for source, key in keys.items()},
            })

        p = min(settings.pairs, len(data.pair_ids))
        if p:
            before, after = model.sparse_latents(data.pairs_before[:p]), model.sparse_latents(data.pairs_after[:p])
            switched = switched_latents(before, after, labels, best, settings.switched)
            result["pairs"] += [{"kind": data.kind, "pair": int(data.pair_ids[i]), "edit": data.pair_edits[i], **switched[i]} for i in range(p)]
    return result
