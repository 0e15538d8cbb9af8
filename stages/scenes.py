"""Stage `scenes`: render the procedural offline dataset (images, attributes, captions, pairs, vocabulary).

Output: store/data/ (layout in `pipeline.dataset`), written to a sibling and renamed into place.
Reads params: seed, data.
"""

from __future__ import annotations

import logging
import shutil
import time

from pipeline.config import Params, load_params
from pipeline.data import scenes as world
from pipeline.dataset import write_dataset
from pipeline.paths import Layout
from pipeline.provenance import code_version
from pipeline.store import replace_dir
from stages._cli import exit_with, parser, run_main

log = logging.getLogger(__name__)


def run(params: Params, layout: Layout) -> None:
    data = params.data
    start = time.perf_counter()
    scenes = world.generate_objects(data.n_images, image_size=data.image_size, seed=params.seed, split=tuple(data.split))
    n_test = int((scenes.split == 2).sum())
    pairs = world.object_pairs(scenes, min(data.n_pairs, n_test), seed=params.seed + 1)
    log.info("rendered %d images and %d pairs in %.1fs", len(scenes.images), len(pairs.base_index), time.perf_counter() - start)
    tmp = layout.data.with_name(layout.data.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    provenance = {"producer": "stages.scenes", "code": code_version(layout.root), "params": {"seed": params.seed, "data": data.model_dump()}}
    write_dataset(tmp, scenes, pairs, world.vocabulary(scenes), world.zero_shot_prompts(scenes), provenance)
    replace_dir(tmp, layout.data)


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    return run_main("scenes", lambda: run(load_params(args.params), Layout(args.root)))


if __name__ == "__main__":
    exit_with(main())
