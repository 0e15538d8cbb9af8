"""Stage `data`: the dataset every later stage reads (images, attributes, captions, pairs, vocabulary, phrases).

`data.source: scenes` renders the procedural offline world; a real source (folders, cub, coco, syn) is loaded
with its loader (layout checked before any work) and its image files decoded in spawned DataLoader workers
(`pipeline.data.sources`). Undecodable images are skipped and listed in store/data/bad_images.json
(`on_bad_image: skip`) or stop the stage (`fail`). `synthetic` writes planted-concept embeddings, labels and pairs
chunk by chunk, no images (`pipeline.data.synthetic`); the encoder stage then has nothing to do and extract links
its embeddings into store/embeddings.
Output: store/data/ (layout in `pipeline.data.dataset`), written to a sibling and renamed into place.
Reads params: seed, data.
"""

from __future__ import annotations

import dataclasses
import shutil

from pipeline.config import Params, load_params
from pipeline.data.dataset import write_dataset
from pipeline.data.sources import SyntheticSettings, read_source
from pipeline.data.synthetic import write_synthetic
from pipeline.paths import Layout
from pipeline.provenance import code_version
from pipeline.records import write_json
from pipeline.store import replace_dir
from stages._cli import exit_with, parser, run_main


def run(params: Params, layout: Layout) -> None:
    final = layout.data
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    provenance = {"producer": "stages.data", "code": code_version(layout.root), "params": {"seed": params.seed, "data": dataclasses.asdict(params.data)}}
    if isinstance(params.data, SyntheticSettings):
        write_synthetic(tmp, params.data, params.seed, provenance)
        bad_images: list = []
    else:
        source = read_source(params.data, params.seed, images_out=tmp / "images.zarr", fingerprint={"provenance": provenance})
        write_dataset(tmp, source.parts, source.vocabulary, source.prompts, source.phrases, provenance)
        bad_images = source.bad_images
    write_json(tmp / layout.bad_images.name, bad_images)
    replace_dir(tmp, final)


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    return run_main("data", lambda: run(load_params(args.params), Layout(args.root)))


if __name__ == "__main__":
    exit_with(main())
