"""Stage `scenes`: the dataset every later stage reads (images, attributes, captions, pairs, vocabulary).

`data.source: scenes` renders the procedural offline world; a real source (folders, cub, coco, syn)
is loaded with its `pipeline.data` loader (layout checked before any work), and its image files are
decoded in spawned DataLoader workers, resized to `data.image_size` and stored as uint8.
Undecodable images are skipped and listed in store/data/bad_images.json (`on_bad_image: skip`,
labels stay aligned because their rows are dropped) or stop the stage (`fail`).
Output: store/data/ (layout in `pipeline.dataset`), written to a sibling and renamed into place.
Reads params: seed, data.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from pipeline.config import FileData, Params, SceneKind, ScenesData, load_params
from pipeline.data.coco import load_coco
from pipeline.data.cub import load_cub
from pipeline.data.folders import load_folders
from pipeline.data.syn import load_syn
from pipeline.data.vocabulary import DISTRACTORS
from pipeline.images import SquareUint8, iter_image_batches
from pipeline.data import scenes as world
from pipeline.dataset import write_dataset
from pipeline.paths import Layout
from pipeline.provenance import code_version
from pipeline.store import replace_dir
from stages._cli import exit_with, parser, run_main

log = logging.getLogger(__name__)


def render_kind(kind: str, spec: SceneKind, data: ScenesData, seed: int) -> tuple[world.SceneSet, world.PairSet]:
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


def decode(paths: list, size: int, data: FileData, desc: str) -> tuple[np.ndarray, list[dict]]:
    """Decode image files to uint8 (m, size, size, 3) in DataLoader workers; returns the images of the
    decodable files (in order) and the bad ones as {index, path, reason}."""
    out = np.zeros((len(paths), size, size, 3), dtype=np.uint8)
    ok = np.zeros(len(paths), dtype=bool)
    bad: list[dict] = []
    batches = iter_image_batches(paths, SquareUint8(size), batch_size=64, num_workers=data.workers, on_bad_image=data.on_bad_image)
    for batch in tqdm(batches, total=-(-len(paths) // 64), desc=desc, unit="batch"):
        out[batch.indices] = batch.pixels.numpy()
        ok[batch.indices] = True
        bad += [{"index": b.index, "path": b.path, "reason": b.reason} for b in batch.bad]
    return out[ok], bad


def load_files(data: FileData, seed: int) -> tuple[Any, Any, list[dict]]:
    """A real dataset as (SceneSet-like part, PairSet-like pairs, bad images)."""
    check = data.on_bad_image == "fail"  # open every image header up front only when a bad one must stop the stage
    if data.source == "folders":
        table, pair_table = load_folders(data.root, split=tuple(data.split), seed=seed, check=check), None
    elif data.source == "cub":
        table, pair_table = load_cub(data.root, val_fraction=data.split[1], seed=seed, check=check), None
    elif data.source == "coco":
        table, pair_table = load_coco(data.root, split_name=data.coco_split, split=tuple(data.split), seed=seed, check=check), None
    else:
        table, pair_table = load_syn(data.root, check=check)
    images, bad = decode(table.paths, data.image_size, data, f"{table.kind} images")
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


def run(params: Params, layout: Layout) -> None:
    data = params.data
    bad: list[dict] = []
    if isinstance(data, ScenesData):
        parts = [render_kind(kind, spec, data, params.seed) for kind, spec in data.kinds.items()]
        prompts = {family: p for scenes, _ in parts if scenes.kind == "objects" for family, p in world.zero_shot_prompts(scenes).items()}
        vocabulary = world.vocabulary()
    else:
        part, pairs, bad = load_files(data, params.seed)
        parts = [(part, pairs)]
        prompts = {f: [f"a photo of {part.attribute_names[c]}" for c in cols] for f, cols in part.families.items()}
        vocabulary = list(dict.fromkeys([*part.attribute_names, *DISTRACTORS]))
    tmp = layout.data.with_name(layout.data.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    provenance = {"producer": "stages.scenes", "code": code_version(layout.root), "params": {"seed": params.seed, "data": data.model_dump()}}
    write_dataset(tmp, parts, vocabulary, prompts, provenance)
    (tmp / "bad_images.json").write_text(json.dumps(bad, indent=1))
    replace_dir(tmp, layout.data)


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    return run_main("scenes", lambda: run(load_params(args.params), Layout(args.root)))


if __name__ == "__main__":
    exit_with(main())
