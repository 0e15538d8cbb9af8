"""Stage `data`: the dataset every later stage reads (images, attributes, captions, pairs, vocabulary, phrases).

`data.source: scenes` renders the procedural offline world; a real source (folders, cub, coco, syn) is loaded
with its loader (layout checked before any work) and its image files decoded in spawned DataLoader workers
(`pipeline.data.sources`). Undecodable images are skipped and listed in store/data/bad_images.json
(`on_bad_image: skip`) or stop the stage (`fail`). Splits too small for the evaluation stop the stage before
anything is kept (`pipeline.config.split_problems`). `synthetic` writes planted-concept embeddings, labels and pairs
chunk by chunk, no images (`pipeline.data.synthetic`); the encoder stage then has nothing to do and extract links
its embeddings into store/embeddings.
Output: store/data/ (layout in `pipeline.data.dataset`), written to a sibling and renamed into place.
Reads params: seed, data.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pipeline.atomic import atomic_dir
from pipeline.config import Params, ParamsError, load_params, split_problems
from pipeline.data.dataset import IMAGES, write_dataset
from pipeline.data.options import SyntheticSettings
from pipeline.data.sources import read_source
from pipeline.data.synthetic import write_synthetic
from pipeline.paths import Layout
from pipeline.provenance import code_digest
from pipeline.records import write_json
from stages.runner import exit_with, parser, run_main

#: the code that decides the dataset's content (dvc.yaml lists each as a dependency of the stage; a test checks it)
DATA_CODE = ("pipeline/data", "pipeline/store.py", "stages/data.py")


def run(params: Params, layout: Layout) -> None:
    provenance = {"producer": "stages.data", "code": code_digest(DATA_CODE), "params": {"seed": params.seed, "data": dataclasses.asdict(params.data)}}
    with atomic_dir(layout.data) as tmp:
        if isinstance(params.data, SyntheticSettings):
            write_synthetic(tmp, params.data, params.seed, provenance)
            bad_images: list = []
        else:
            source = read_source(params.data, params.seed, images_out=tmp / IMAGES, fingerprint={"provenance": provenance})
            # the splits as read (a real dataset's undecodable images are dropped now): refused here, not stages later
            problems = split_problems({part.kind: tuple(int(c) for c in np.bincount(part.split, minlength=3)) for part, _ in source.parts}, params)
            if problems:
                raise ParamsError("\n".join(f"{layout.params}: {line}" for line in problems))
            write_dataset(tmp, source.parts, source.vocabulary, source.prompts, source.phrases, provenance)
            bad_images = source.bad_images
        write_json(tmp / layout.bad_images.name, bad_images)


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    return run_main("data", lambda: run(load_params(args.params), Layout(args.root)))


if __name__ == "__main__":
    exit_with(main())
