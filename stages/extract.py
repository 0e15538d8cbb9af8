"""Stage `extract`: embed images, captions, the concept vocabulary and both sides of every benchmark pair.

Outputs in store/embeddings/: images.zarr (n, d), captions.zarr (n, d) and concepts.zarr (V, d)
(encoders with a text tower), pairs_before.zarr and pairs_after.zarr (p, d), each float32 with
provenance attributes (encoder id, dataset fingerprint). Images stream from the dataset's uint8
store in blocks of `READ_BATCHES` batches, read (decompressed and checked) by a thread pool two blocks ahead of
the encoder (memory: three blocks); each block is one `encode_images` call, so the device is waited for once per
block. Pretrained encoders apply their own preprocessing, on the device for whole uint8 batches where
`pipeline.encoders.pixels` mirrors it, and run in bfloat16 autocast on a GPU.
Work happens in store/embeddings.tmp/ (kept if the stage is killed): a rerun resumes every
store from its last complete chunk, then the directory is renamed into place.
A dataset that brings its own embeddings (the synthetic source: no images, store/data/embeddings/) is not
encoded: its stores are hard-linked into store/embeddings (no copy; copied where links are impossible).
Reads params: extract.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from pipeline.atomic import atomic_dir
from pipeline.config import Params, load_params
from pipeline.data.dataset import open_dataset
from pipeline.encoders.base import Encoder
from pipeline.encoders.registry import open_encoder
from pipeline.paths import Layout
from pipeline.provenance import code_digest, digest
from pipeline.store import Store, StoreError, StoreWriter, open_store, write_array
from stages.runner import exit_with, parser, run_main

#: the code that decides the embeddings (dvc.yaml lists each as a dependency of the stage; a test checks it)
EXTRACT_CODE = ("pipeline/encoders", "pipeline/store.py", "stages/extract.py")

log = logging.getLogger(__name__)

#: forward batches per block of images read ahead and encoded in one call
READ_BATCHES = 8


def embed_store(encoder: Encoder, images: Store, out: Path, batch_size: int, chunk_rows: int, fingerprint: dict[str, Any],
                attrs: dict[str, Any], desc: str) -> None:
    """Stream `images` (uint8 (n, H, W, 3)) through the encoder into a float32 (n, d) store, resumably.

    A store already finished from the same fingerprint (an earlier, interrupted run of the stage) is kept if every
    chunk passes its checksum.
    """
    if out.exists():
        try:
            store = open_store(out)
            if store.attrs.get("fingerprint") == json.loads(json.dumps(fingerprint)):
                store.verify()  # every chunk's checksum: a damaged store is written again, never kept
                log.info("%s: already complete, kept", out)
                return
        except StoreError as e:
            log.warning("%s; writing it again", e)
    writer = StoreWriter(out, (encoder.dim,), np.float32, fingerprint=fingerprint, attrs=attrs, expected_rows=len(images), chunk_rows=chunk_rows)
    block = batch_size * READ_BATCHES  # forward batches start at the same rows as in an uninterrupted run (resumes are chunk-aligned)
    blocks = [(start, min(start + block, len(images))) for start in range(writer.n_rows, len(images), block)]
    with tqdm(total=len(images), initial=writer.n_rows, desc=desc, unit="img") as bar:
        for batch in images.read_ranges(blocks, ahead=2):
            writer.append(encoder.encode_images(batch, batch_size=batch_size))
            bar.update(len(batch))
    writer.close()


def link_tree(src: Path, dst: Path) -> None:
    """A copy of the folder `src` at `dst` whose files are hard links to the originals (a plain copy where the
    filesystem refuses links)."""

    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link)


def link_own_embeddings(layout: Layout) -> None:
    """store/embeddings from the dataset's own stores (store/data/embeddings), every one the later stages read."""
    with atomic_dir(layout.embeddings) as tmp:
        for path in (layout.image_embeddings, layout.pair_embeddings("before"), layout.pair_embeddings("after"), layout.concept_embeddings):
            source = layout.data_embeddings / path.name
            open_store(source)  # a clear error if the data stage left it missing or unfinished
            link_tree(source, tmp / path.name)
    log.info("%s: linked the dataset's own embeddings from %s (no encoder)", layout.embeddings, layout.data_embeddings)


def run(params: Params, layout: Layout) -> None:
    data = open_dataset(layout.data)
    if data.has_embeddings:
        link_own_embeddings(layout)
        return
    encoder = open_encoder(layout.encoder)
    with atomic_dir(layout.embeddings, resume=True) as tmp:  # its stores resume from their last complete chunk
        base = {"encoder": encoder.id, "dataset": digest(data.meta["provenance"]), "code": code_digest(EXTRACT_CODE),
                "threads": params.threads}  # CPU sums depend on the thread count: a resume must not mix two
        attrs = {"producer": "stages.extract", "encoder": encoder.id, "dim": encoder.dim}
        bs, chunk = params.extract.batch_size, params.extract.chunk_rows

        def inside(path: Path) -> Path:
            """Where an output of store/embeddings/ is built: in the temporary sibling renamed into place at the end."""
            return tmp / path.name

        embed_store(encoder, data.images, inside(layout.image_embeddings), bs, chunk, {**base, "what": "images"}, {**attrs, "rows": "dataset images"}, "images")
        for side in ("before", "after"):
            embed_store(encoder, getattr(data.pairs, side), inside(layout.pair_embeddings(side)), bs, chunk, {**base, "what": f"pairs_{side}"},
                        {**attrs, "rows": f"pairs ({side})"}, f"pairs {side}")
        if encoder.has_text:
            vocab = data.vocabulary
            write_array(inside(layout.concept_embeddings), encoder.encode_texts(vocab, batch_size=bs),
                        fingerprint={**base, "what": "concepts", "vocabulary": digest(vocab)}, attrs={**attrs, "rows": "concept vocabulary", "texts": vocab})
            # captions repeat (procedural templates): embed each distinct caption once, store one row per image
            distinct, inverse = np.unique(np.asarray(data.captions, dtype=object), return_inverse=True)
            write_array(inside(layout.caption_embeddings), encoder.encode_texts(distinct.tolist(), batch_size=bs)[inverse],
                        fingerprint={**base, "what": "captions", "captions": digest(data.captions)}, attrs={**attrs, "rows": "image captions"})
        else:
            log.warning("encoder %s has no text tower: concept naming will be unavailable", encoder.id)


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    return run_main("extract", lambda: run(load_params(args.params), Layout(args.root)))


if __name__ == "__main__":
    exit_with(main())
