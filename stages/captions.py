"""Stage `captions`: train the embedded caption decoder on the training split's (image embedding, caption) pairs.

The decoder (pipeline.explain.captions) reads any embedding, so this works for every encoder, with or
without a captioning model of its own. Rows: the dataset's training split (split 0) of
store/embeddings/images.zarr, with their captions from store/data/meta.json.
Output store/captions/ (model.safetensors, config.json, history.json), written to a sibling and renamed
into place. Reads params: seed, explain.decoder.
"""

from __future__ import annotations

import json
import logging
import shutil

from pipeline.config import Params, load_params
from pipeline.dataset import open_dataset
from pipeline.explain.captions import CaptionDecoder, DecoderHistory, save_decoder, train_decoder
from pipeline.paths import Layout
from pipeline.store import open_store, replace_dir
from stages._cli import exit_with, parser, run_main

log = logging.getLogger(__name__)


def run(params: Params, layout: Layout) -> tuple[CaptionDecoder, DecoderHistory]:
    data = open_dataset(layout.data)
    store = open_store(layout.embeddings / "images.zarr")
    if len(store) != data.meta["n"]:
        raise ValueError(f"{layout.embeddings / 'images.zarr'}: {len(store)} rows, but the dataset has {data.meta['n']}; rerun extract")
    rows = data.rows("train")
    if len(rows) == 0:
        raise ValueError(f"{layout.data}: the training split is empty; the caption decoder needs (embedding, caption) pairs")
    captions = [data.captions[i] for i in rows]
    decoder, history = train_decoder(store.take(rows), captions, params.explain.decoder.config(), seed=params.seed)
    out = layout.captions
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    save_decoder(decoder, tmp)
    (tmp / "history.json").write_text(json.dumps({"pairs": len(rows), "vocabulary": len(decoder.vocab), "loss": history.loss,
                                                  "token_accuracy": history.token_accuracy, "seconds": history.seconds,
                                                  "steps": history.steps}, indent=1))
    replace_dir(tmp, out)
    log.info("caption decoder: %d pairs, vocabulary %d, final loss %.3f, token accuracy %.3f, %.1f s",
             len(rows), len(decoder.vocab), history.loss[-1], history.token_accuracy[-1], history.seconds)
    return decoder, history


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    return run_main("captions", lambda: run(load_params(args.params), Layout(args.root)))


if __name__ == "__main__":
    exit_with(main())
