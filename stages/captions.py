"""Stage `captions`: train the embedded caption decoder on the training split's (image embedding, caption) pairs.

The decoder (`pipeline.explain.decoder`) reads any embedding, so this works for every encoder, with or without a
captioning model of its own. Rows: the dataset's training split of store/embeddings/images.zarr, with their
captions (at most `captions.max_pairs` of them: a seeded subsample, read by row). Output store/captions/ (model.safetensors, config.json, history.json), written to a sibling and renamed
into place. Reads params: seed, captions.
"""

from __future__ import annotations

import logging

from pipeline.atomic import atomic_dir
from pipeline.config import Params, load_params
from pipeline.data.dataset import open_dataset, open_embeddings, sample_rows
from pipeline.explain.decoder import CaptionDecoder, save_decoder, train_decoder
from pipeline.paths import Layout
from pipeline.records import write_json
from stages.runner import exit_with, parser, run_main

log = logging.getLogger(__name__)


def run(params: Params, layout: Layout) -> CaptionDecoder:
    data = open_dataset(layout.data)
    store = open_embeddings(data, layout.image_embeddings)
    rows = sample_rows(data.rows("train"), params.captions.max_pairs, params.seed)
    if len(rows) == 0:
        raise ValueError(f"{layout.data}: the training split is empty; the caption decoder needs (embedding, caption) pairs")
    decoder, history = train_decoder(store.take(rows), data.caption_rows(rows), params.captions, seed=params.seed)
    with atomic_dir(layout.captions) as tmp:
        save_decoder(decoder, tmp)
        write_json(tmp / layout.captions_history.name, {"pairs": len(rows), "vocabulary": len(decoder.vocab), "history": history})
    last = history[-1]
    log.info("caption decoder: %d pairs, vocabulary %d, final loss %.3f, token accuracy %.3f", len(rows), len(decoder.vocab),
             last["train_loss"], last["train_token_accuracy"])
    return decoder


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    return run_main("captions", lambda: run(load_params(args.params), Layout(args.root)))


if __name__ == "__main__":
    exit_with(main())
