"""Stage `scenes`: render the procedural offline dataset (images, attributes, captions, pairs, vocabulary).

Output: store/data/ (layout in `pipeline.dataset`), written to a sibling and renamed into place.
Reads params: seed, data.
"""

from __future__ import annotations

import logging
import shutil
import time

from pipeline.config import DataParams, Params, SceneKind, load_params
from pipeline.data import scenes as world
from pipeline.dataset import write_dataset
from pipeline.paths import Layout
from pipeline.provenance import code_version
from pipeline.store import replace_dir
from stages._cli import exit_with, parser, run_main

log = logging.getLogger(__name__)


def render_kind(kind: str, spec: SceneKind, data: DataParams, seed: int) -> tuple[world.SceneSet, world.PairSet]:
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


def run(params: Params, layout: Layout) -> None:
    data = params.data
    parts = [render_kind(kind, spec, data, params.seed) for kind, spec in data.kinds.items()]
    prompts = {family: p for scenes, _ in parts if scenes.kind == "objects" for family, p in world.zero_shot_prompts(scenes).items()}
    tmp = layout.data.with_name(layout.data.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    provenance = {"producer": "stages.scenes", "code": code_version(layout.root), "params": {"seed": params.seed, "data": data.model_dump()}}
    write_dataset(tmp, parts, world.vocabulary(), prompts, provenance)
    replace_dir(tmp, layout.data)


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    return run_main("scenes", lambda: run(load_params(args.params), Layout(args.root)))


if __name__ == "__main__":
    exit_with(main())
