"""The synthetic scale source: planted sparse concepts written straight to embeddings, chunk by chunk.

The model (settings: `pipeline.data.options.SyntheticSettings`). There are A = families x values binary concepts,
concept (f, v) named "f<f>v<v>" (zero-padded, "f03v07") with a unit direction D[f, v] in R^d (Gaussian, normalised; A may exceed d, as
real features outnumber dimensions). Row r has exactly one value v_rf of every family f (uniform, independent): its
labels are one-hot per family (CUB-like, so probes, relevance and attribute-edit pairs all apply), and its
embedding is

    x_r = offset * e + sum_f m_rf D[f, v_rf] + noise * z_r,     m_rf ~ U[0.5, 1.5], z_r ~ N(0, I_d),

with e a fixed random unit vector. So every embedding is a sparse (`families`-term) combination of planted
directions: a sparse model that recovers them matches the labels perfectly, and its latents are named by the
concepts whose "text embeddings" are the directions themselves (the concept store holds D with the names).
An intervention pair is a test row and the same row with one family's value swapped (same magnitude and noise):
x' = x - m D[f, v] + m D[f, v']. Captions list the row's concepts ("f0v3 f1v10 ...").

Everything is drawn per block of `BLOCK_ROWS` rows from a generator seeded by (seed, block) and written before the
next block is drawn, so the data stage's memory is one block (BLOCK_ROWS x (d floats + A bools)) whatever n is,
and the same settings and seed give the same stores. Written into the dataset
folder (layout of `pipeline.data.dataset`: attributes, split, source, captions, meta, pairs, no images) and its
embeddings/ folder: images.zarr (n, d), pairs_before.zarr and pairs_after.zarr (p, d), concepts.zarr (A, d) with
the names as attrs["texts"] (what the extract stage would write; it links them into store/embeddings).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import sparse

from pipeline.data.options import SyntheticSettings
from pipeline.data.phrases import name_phrases
from pipeline.provenance import digest
from pipeline.store import StoreWriter, write_array

log = logging.getLogger(__name__)

KIND = "synthetic"
#: rows drawn and written at a time (fixed: the data must not depend on a memory knob)
BLOCK_ROWS = 8192
#: the embedding stores written into <dataset>/embeddings/, named as the extract stage names its own
EMBEDDING_STORES = ("images.zarr", "pairs_before.zarr", "pairs_after.zarr", "concepts.zarr")


def concept_names(settings: SyntheticSettings) -> list[str]:
    """"f<f>v<v>" for every concept, family-major (column f * values + v), zero-padded to one width ("f03v07")."""
    fw, vw = len(str(settings.families - 1)), len(str(settings.values - 1))
    return [f"f{f:0{fw}d}v{v:0{vw}d}" for f in range(settings.families) for v in range(settings.values)]


def caption_bytes(columns: np.ndarray, names: list[str]) -> np.ndarray:
    """uint8 (rows, W): each row's concept names joined by single spaces, UTF-8 (the names have one width, so every
    caption has the same length and the bytes are gathered without a loop over rows)."""
    tokens = np.frombuffer("".join(names).encode(), dtype=np.uint8).reshape(len(names), -1)
    rows, families = columns.shape
    spaced = np.concatenate([tokens[columns], np.full((rows, families, 1), ord(" "), np.uint8)], axis=2)
    return spaced.reshape(rows, -1)[:, :-1]


def directions(settings: SyntheticSettings, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(D float32 (A, d) unit concept directions, e float32 (d,) the unit offset direction)."""
    rng = np.random.default_rng([seed, 0])
    raw = rng.normal(size=(settings.families * settings.values + 1, settings.d))
    raw /= np.linalg.norm(raw, axis=1, keepdims=True)
    return raw[:-1].astype(np.float32), raw[-1].astype(np.float32)


def split_of(settings: SyntheticSettings, seed: int) -> np.ndarray:
    """int8 (n,): 0 train, 1 validation, 2 test, exact fractions (rounded down for train and validation), seeded."""
    n = settings.n
    n_train, n_val = int(n * settings.split[0]), int(n * settings.split[1])
    split = np.full(n, 2, dtype=np.int8)
    order = np.random.default_rng([seed, 1]).permutation(n)
    split[order[:n_train]] = 0
    split[order[n_train : n_train + n_val]] = 1
    return split


def draw_block(settings: SyntheticSettings, seed: int, block: int, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One block's values int64 (rows, F), magnitudes float32 (rows, F) and noise float32 (rows, d)."""
    rng = np.random.default_rng([seed, 2, block])
    values = rng.integers(0, settings.values, size=(rows, settings.families))
    magnitudes = rng.uniform(0.5, 1.5, size=(rows, settings.families)).astype(np.float32)
    noise = (settings.noise * rng.standard_normal(size=(rows, settings.d), dtype=np.float32)).astype(np.float32)
    return values, magnitudes, noise


def embed(columns: np.ndarray, magnitudes: np.ndarray, noise: np.ndarray, concepts: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """float32 (rows, d): offset + sum over families of magnitude x direction(column) + noise; columns int (rows, F)."""
    rows, families = columns.shape
    codes = sparse.csr_array((magnitudes.ravel(), columns.ravel(), np.arange(0, rows * families + 1, families)), shape=(rows, len(concepts)))
    return (codes @ concepts + offset[None, :] + noise).astype(np.float32)


def write_synthetic(root: Path, settings: SyntheticSettings, seed: int, provenance: dict[str, Any]) -> None:
    """Write the synthetic dataset and its embeddings into `root` (see the module docstring), block by block."""
    start = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    (root / "pairs").mkdir(exist_ok=True)
    emb = root / "embeddings"
    emb.mkdir(exist_ok=True)
    n, d, families, values = settings.n, settings.d, settings.families, settings.values
    names = concept_names(settings)
    a = len(names)
    concepts, unit_offset = directions(settings, seed)
    offset = settings.offset * unit_offset
    split = split_of(settings, seed)
    pair_rows = np.sort(np.random.default_rng([seed, 3]).choice(np.flatnonzero(split == 2), size=settings.n_pairs, replace=False))
    fp = {"provenance": provenance}
    encoder_id = f"synthetic:{digest({'settings': dataclasses.asdict(settings), 'seed': seed})}"
    base = {"encoder": encoder_id, "dataset": digest(provenance)}
    attrs = {"producer": "stages.data (synthetic source)", "encoder": encoder_id, "dim": d}
    width = families * (len(names[0]) + 1) - 1
    writers = {
        "attributes": StoreWriter(root / "attributes.zarr", (a,), bool, fingerprint=fp, expected_rows=n),
        "captions": StoreWriter(root / "captions.zarr", (width,), np.uint8, fingerprint=fp, expected_rows=n),
        "images": StoreWriter(emb / "images.zarr", (d,), np.float32, fingerprint={**base, "what": "images"}, expected_rows=n,
                              attrs={**attrs, "rows": "dataset rows"}),
    }
    picked: dict[str, list[np.ndarray]] = {"x": [], "columns": [], "magnitudes": []}
    for block, lo in enumerate(range(0, n, BLOCK_ROWS)):
        hi = min(n, lo + BLOCK_ROWS)
        value, magnitude, noise = draw_block(settings, seed, block, hi - lo)
        columns = np.arange(families) * values + value  # (rows, F) concept columns
        x = embed(columns, magnitude, noise, concepts, offset)
        labels = np.zeros((hi - lo, a), dtype=bool)
        np.put_along_axis(labels, columns, True, axis=1)
        writers["attributes"].append(labels)
        writers["captions"].append(caption_bytes(columns, names))
        writers["images"].append(x)
        mine = pair_rows[(pair_rows >= lo) & (pair_rows < hi)] - lo
        picked["x"].append(x[mine])
        picked["columns"].append(columns[mine])
        picked["magnitudes"].append(magnitude[mine])
    for writer in writers.values():
        writer.close()
    before, columns, magnitudes = (np.concatenate(picked[key]) for key in ("x", "columns", "magnitudes"))
    write_pairs(root, emb, settings, seed, pair_rows, before, columns, magnitudes, concepts, names, fp, base, attrs)
    write_array(root / "split.zarr", split, fingerprint=fp)
    write_array(root / "source.zarr", np.zeros(n, dtype=np.int8), fingerprint=fp)
    write_array(emb / "concepts.zarr", concepts, fingerprint={**base, "what": "concepts", "vocabulary": digest(names)},
                attrs={**attrs, "rows": "concept vocabulary (the planted directions)", "texts": names})
    meta = {
        "kinds": {KIND: {"columns": list(range(a)), "families": {f"f{f}": list(range(f * values, (f + 1) * values)) for f in range(families)},
                         "one_hot": True, "n": n}},
        "n": n, "image_size": None, "images": False, "embeddings": True, "attribute_names": names, "phrases": name_phrases(names),
        "vocabulary": names, "prompts": {}, "provenance": provenance,
    }
    (root / "meta.json").write_text(json.dumps(meta, indent=1))
    log.info("synthetic: %d rows x %d dims, %d concepts, %d pairs written in %.1f s", n, d, a, len(pair_rows), time.perf_counter() - start)


def write_pairs(root: Path, emb: Path, settings: SyntheticSettings, seed: int, rows: np.ndarray, before: np.ndarray, columns: np.ndarray,
                magnitudes: np.ndarray, concepts: np.ndarray, names: list[str], fp: dict[str, Any], base: dict[str, Any],
                attrs: dict[str, Any]) -> None:
    """The intervention pairs: for each chosen test row, one family's value swapped for another (same magnitude)."""
    p, a = len(rows), len(names)
    rng = np.random.default_rng([seed, 4])
    family = rng.integers(0, settings.families, size=p)
    shift = rng.integers(1, settings.values, size=p)  # the new value differs from the old one
    removed = columns[np.arange(p), family]
    added = family * settings.values + (removed - family * settings.values + shift) % settings.values
    m = magnitudes[np.arange(p), family][:, None]
    after = (before - m * concepts[removed] + m * concepts[added]).astype(np.float32)
    before_labels = np.zeros((p, a), dtype=bool)
    np.put_along_axis(before_labels, columns, True, axis=1)
    after_labels = before_labels.copy()
    after_labels[np.arange(p), removed] = False
    after_labels[np.arange(p), added] = True
    write_array(root / "pairs" / "before_attributes.zarr", before_labels, fingerprint=fp)
    write_array(root / "pairs" / "after_attributes.zarr", after_labels, fingerprint=fp)
    (root / "pairs" / "meta.json").write_text(json.dumps({
        "kind": [KIND] * p, "base_index": rows.tolist(), "family": [f"f{f}" for f in family.tolist()],
        "removed": removed.tolist(), "added": added.tolist()}))
    for side, x in (("before", before), ("after", after)):
        write_array(emb / f"pairs_{side}.zarr", x.reshape(p, settings.d), fingerprint={**base, "what": f"pairs_{side}"},
                    attrs={**attrs, "rows": f"pairs ({side})"})
