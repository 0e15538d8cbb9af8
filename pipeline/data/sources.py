"""The data sources params.yaml can name (`data:`), and reading one into the parts of a dataset.

- `scenes` (`ScenesSettings`): the procedural offline world (`pipeline.data.world`): `objects` scenes (CUB-like,
  one-hot attribute families, attribute-edit pairs) and/or `multi` scenes (COCO-like, multi-label categories,
  object-removal pairs), rendered from the seed.
- `folders`, `cub`, `coco`, `syn` (`FileSettings`): a real dataset on disk (the loaders beside this module). Its
  image files are decoded once in DataLoader workers, resized to `image_size` and kept as uint8; undecodable images
  are skipped and listed (`on_bad_image: skip`, labels stay aligned because their rows are dropped) or stop the
  stage (`fail`).

- `synthetic` (`SyntheticSettings`): planted sparse concepts written straight to embeddings (no images, no encoder;
  `pipeline.data.synthetic`), so that the training and evaluation half of the pipeline runs, and is benchmarked,
  at any size on any machine; it doubles as the planted-recovery benchmark at scale.

`read_source(settings, seed)` returns what `pipeline.data.dataset.write_dataset` stores (images and labels in
memory); the synthetic source is written chunk by chunk by `pipeline.data.synthetic.write_synthetic` instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from pipeline.data.coco import load_coco
from pipeline.data.cub import load_cub
from pipeline.data.folders import load_folders
from pipeline.data.images import SquareUint8, iter_image_batches
from pipeline.data.options import FileSettings, SceneKind, ScenesSettings
from pipeline.data.phrases import name_phrases
from pipeline.data.syn_benchmarks import load_syn
from pipeline.data.table import assign_split
from pipeline.data.world import scenes as world
from pipeline.data.world.texts import attribute_phrases, zero_shot_prompts
from pipeline.data.world.vocabulary import DISTRACTORS, vocabulary
from pipeline.store import Store, StoreWriter

log = logging.getLogger(__name__)

@dataclass
class Source:
    """A data source read into what the dataset stores: (images and labels, pairs) per kind, the concept
    vocabulary, zero-shot prompts per family, the rule for caption phrases, and the images that were skipped."""

    parts: list[tuple[Any, Any]]
    vocabulary: list[str]
    prompts: dict[str, list[str]]
    phrases: Callable[[list[str]], list[list[str]]]
    bad_images: list[dict[str, Any]] = field(default_factory=list)


def render_kind(kind: str, spec: SceneKind, data: ScenesSettings, seed: int) -> tuple[world.SceneSet, world.PairSet]:
    """One kind of scene and its intervention pairs (from its test split)."""
    start = time.perf_counter()
    split = tuple(data.split)
    if kind == "objects":
        scenes = world.generate_objects(spec.n_images, image_size=data.image_size, seed=seed, split=split)
        pairs = world.object_pairs(scenes, min(spec.n_pairs, int((scenes.split == 2).sum())), seed=seed + 1)
    else:
        scenes = world.generate_multi(spec.n_images, image_size=data.image_size, seed=seed, split=split, max_objects=spec.max_objects)
        pairs = world.multi_pairs(scenes, min(spec.n_pairs, int((scenes.split == 2).sum())), seed=seed + 1)
    log.info("%s: rendered %d images and %d pairs in %.1fs", kind, len(scenes.images), len(pairs.base_index), time.perf_counter() - start)
    return scenes, pairs


def decode(paths: list, size: int, data: FileSettings, desc: str, out: StoreWriter | None = None) -> tuple[np.ndarray | Store, list[dict]]:
    """Decode image files to uint8 (m, size, size, 3) in DataLoader workers; returns the images of the decodable
    files (in order) and the bad ones as {index, path, reason}. With `out` (a StoreWriter of rows (size, size, 3)) the
    images are appended to it batch by batch as they arrive, in row order, and the finished store is returned:
    memory is then a few batches whatever the number of images (ImageNet's 1.28 M at 224 px would be 193 GB)."""
    pixels = np.zeros((0 if out is not None else len(paths), size, size, 3), dtype=np.uint8)
    ok = np.zeros(len(paths), dtype=bool)
    bad: list[dict] = []
    batches = iter_image_batches(paths, SquareUint8(size), batch_size=64, num_workers=data.workers, on_bad_image=data.on_bad_image, draft=size)
    for batch in tqdm(batches, total=-(-len(paths) // 64), desc=desc, unit="batch"):
        if out is not None:
            out.append(batch.pixels.numpy().reshape(-1, size, size, 3))
        else:
            pixels[batch.indices] = batch.pixels.numpy()
        ok[batch.indices] = True
        bad += [{"index": b.index, "path": b.path, "reason": b.reason} for b in batch.bad]
    return (out.finalize() if out is not None else pixels[ok]), bad


def read_table(data: FileSettings, seed: int, check: bool) -> tuple[Any, Any]:
    """The loader's (ImageTable, PairTable or None) of a real dataset: file lists, labels and the split, no pixels.
    check: open every image header first (the loader names the first bad file)."""
    if data.source == "folders":
        return load_folders(data.root, split=tuple(data.split), seed=seed, check=check), None
    if data.source == "cub":
        return load_cub(data.root, val_fraction=data.split[1], seed=seed, check=check), None
    if data.source == "coco":
        return load_coco(data.root, split_name=data.coco_split, split=tuple(data.split), seed=seed, check=check), None
    table, pair_table = load_syn(data.root, check=check)
    # the benchmark's base images are split by `split` like any source, so models can train on them (the loader marks
    # them all test: the pairs are the evaluation set, and every pair is scored whatever its base's split)
    table.split = assign_split(np.zeros(len(table.paths), dtype=np.int64), tuple(data.split), seed)
    return table, pair_table


def split_counts(data: ScenesSettings | FileSettings, seed: int) -> dict[str, tuple[int, int, int]]:
    """Images per (train, validation, test) split of each kind the source gives, before any image is read: exact for
    scenes (the world's split rule), from the loader's file table for a real dataset (undecodable files not yet
    dropped)."""
    if isinstance(data, ScenesSettings):
        return data.split_counts(seed)
    table, _ = read_table(data, seed, check=False)
    return {table.kind: tuple(int(c) for c in np.bincount(table.split, minlength=3))}


def load_files(data: FileSettings, seed: int, images_out: Path | None = None, fingerprint: dict[str, Any] | None = None) -> tuple[Any, Any, list[dict]]:
    """A real dataset as (SceneSet-like part, PairSet-like pairs, bad images). images_out: where to stream the
    decoded images (a row store, fingerprinted with `fingerprint`); the part's `images` is then that store."""
    # open every image header up front only when a bad one must stop the stage
    table, pair_table = read_table(data, seed, check=data.on_bad_image == "fail")
    writer = None if images_out is None else StoreWriter(images_out, (data.image_size, data.image_size, 3), np.uint8, fingerprint=fingerprint or {})
    images, bad = decode(table.paths, data.image_size, data, f"{table.kind} images", writer)
    keep = np.ones(len(table.paths), dtype=bool)
    keep[[b["index"] for b in bad]] = False
    part = SimpleNamespace(kind=table.kind, images=images, attributes=table.attributes[keep], attribute_names=table.attribute_names,
                           families=table.families, captions=[c for c, k in zip(table.captions, keep) if k], split=table.split[keep])
    size = data.image_size
    empty = SimpleNamespace(before=np.zeros((0, size, size, 3), np.uint8), after=np.zeros((0, size, size, 3), np.uint8),
                            before_attributes=np.zeros((0, part.attributes.shape[1]), bool), after_attributes=np.zeros((0, part.attributes.shape[1]), bool),
                            base_index=np.zeros(0, np.int64), family=[], removed=np.zeros(0, np.int64), added=np.zeros(0, np.int64),
                            edit_mask=np.zeros((0, size, size), bool))
    if pair_table is None:
        return part, empty, bad
    before, bad_before = decode(pair_table.before, size, data, "pairs (before)")
    after, bad_after = decode(pair_table.after, size, data, "pairs (after)")
    dropped = {b["index"] for b in bad_before + bad_after} | {i for i, base in enumerate(pair_table.base_index) if not keep[base]}
    use = np.array([i not in dropped for i in range(len(pair_table.base_index))], dtype=bool)
    ok_before = np.ones(len(use), bool)
    ok_before[[b["index"] for b in bad_before]] = False
    ok_after = np.ones(len(use), bool)
    ok_after[[b["index"] for b in bad_after]] = False
    new_row = np.cumsum(keep) - 1  # old table row -> row after dropping bad images
    pairs = SimpleNamespace(
        before=before[use[ok_before]], after=after[use[ok_after]],
        before_attributes=pair_table.before_attributes[use], after_attributes=pair_table.after_attributes[use],
        base_index=new_row[pair_table.base_index[use]], family=[f for f, u in zip(pair_table.family, use) if u],
        removed=pair_table.removed[use], added=pair_table.added[use], edit_mask=np.ones((int(use.sum()), size, size), bool))
    return part, pairs, bad + [{**b, "what": "pair before"} for b in bad_before] + [{**b, "what": "pair after"} for b in bad_after]


def read_source(data: ScenesSettings | FileSettings, seed: int, images_out: Path | None = None, fingerprint: dict[str, Any] | None = None) -> Source:
    """Render the scene world, or load a real dataset, into a `Source`. images_out: a real dataset's images are
    streamed into this row store as they are decoded (`decode`) instead of being held in memory."""
    if isinstance(data, ScenesSettings):
        parts = [render_kind(kind, spec, data, seed) for kind, spec in data.kinds.items()]
        prompts = zero_shot_prompts("objects") if "objects" in data.kinds else {}
        return Source(parts, vocabulary(), prompts, attribute_phrases)
    part, pairs, bad = load_files(data, seed, images_out, fingerprint)
    prompts = {f: [f"a photo of {part.attribute_names[c]}" for c in cols] for f, cols in part.families.items()}
    return Source([(part, pairs)], list(dict.fromkeys([*part.attribute_names, *DISTRACTORS])), prompts, name_phrases, bad)
