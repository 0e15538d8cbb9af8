"""Stage `train`: train one grid cell (method x dictionary size x k) on the image embeddings.

Streams shuffled batches of the training split from store/embeddings/images.zarr (a shuffle
buffer over chunks, never the whole store), validates on the validation split, checkpoints
every epoch in store/models/<run>.tmp/ so a killed run resumes, and writes the final
checkpoint (safetensors + config.json + history.json) to store/models/<run>/.
Reads params: seed, data.split, train, methods.<method>.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time


from pipeline.config import Params, Run
from pipeline.dataset import open_dataset, sample_rows
from pipeline.models import build
from pipeline.models.checkpoint import save_model
from pipeline.paths import Layout
from pipeline.provenance import code_version
from pipeline.resume import load_resume, save_resume
from pipeline.store import open_store, replace_dir
from pipeline.train import TrainResult, fit
from stages._cli import cell_main, exit_with

log = logging.getLogger(__name__)


def run(params: Params, layout: Layout, cell: Run) -> TrainResult:
    settings = params.train_settings(cell.method)
    data = open_dataset(layout.data)
    embeddings = open_store(layout.embeddings / "images.zarr")
    train_rows, val_rows = data.rows("train"), data.rows("val")
    if len(embeddings) != len(data.split):
        raise ValueError(f"{embeddings.path}: {len(embeddings)} rows but the dataset has {len(data.split)} images; rerun extract")
    init_rows = sample_rows(train_rows, settings.init_samples, params.seed)
    model = build(cell.method, embeddings.shape[1], cell.size, cell.k, seed=params.seed, **params.method_options(cell.method))
    work = layout.models / f"{cell.name}.tmp"
    start = time.perf_counter()
    result = fit(
        model,
        embeddings.shuffled_batches(settings.batch_size, params.seed, rows=train_rows),
        math.ceil(len(train_rows) / settings.batch_size),
        embeddings.take(init_rows),
        embeddings.take(val_rows),
        settings,
        save_state=lambda m, o, s, b: save_resume(work, m, o, s, b),
        load_state=lambda m, o: load_resume(work, m, o),
    )
    seconds = time.perf_counter() - start
    final = layout.models / f"{cell.name}.final"
    if final.exists():
        shutil.rmtree(final)
    provenance = {"run": cell.name, "size": cell.size, "code": code_version(layout.root), "embeddings": embeddings.attrs.get("fingerprint"),
                  "train": params.train_settings(cell.method).__dict__}
    save_model(result.model.cpu(), final, provenance)
    (final / "history.json").write_text(json.dumps({"history": result.history, "best_epoch": result.best_epoch,
                                                    "stopped_early": result.stopped_early, "seconds": seconds}, indent=1))
    replace_dir(final, layout.models / cell.name)
    shutil.rmtree(work, ignore_errors=True)
    log.info("%s: trained in %.1fs (best epoch %d)", cell.name, seconds, result.best_epoch)
    return result


def main(argv: list[str] | None = None) -> int:
    return cell_main("train", __doc__.splitlines()[0], run, argv)


if __name__ == "__main__":
    exit_with(main())
