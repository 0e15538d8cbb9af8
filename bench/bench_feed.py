"""Benchmark: the training stage of one cell against its warm bare loop, side by side in one process.

    OMP_NUM_THREADS=1 python bench/bench_feed.py [--n 200000] [--d 768] [--dict 64] [--k 32] [--steps 100]
                                                 [--batch 4096] [--repeats 3] [--feed auto] [--device cpu] [--threads 1]
                                                 [--workdir DIR]

The CPU proxy of the GPU goal (the defaults): a TopK SAE of 64 latents at d = 768 makes a step on two cores about
as cheap, next to the data it reads, as a real step (16,384 latents) is on a GPU, so the stage's own costs (reading
the store, initialisation, validation, checkpoints) show as they do there. A synthetic project of --n embeddings
(`pipeline.data.synthetic`, 80% training rows) is written once into --workdir (kept and reused: pass the same
folder again); then, --repeats times, side by side:

- stage: `pipeline.training.cell_training.train_cell` (the training half of the cell stage, in this process, with its
  imports done: the process start is reported by the stage itself, see below) for --steps optimiser steps of
  --batch rows (train.max_steps; lr 5e-4), its checkpoint folder removed first so it trains;
- bare: the same model (`fit_init` on 4,096 rows), the same number of plain AdamW steps on batches already in memory
  on the device (forward, backward, step, the decoder renormalisation), after 10 warm-up steps (the warm loop).

Prints one JSON line per repeat (stage and bare seconds, ratio = bare / stage, the feed mode the stage chose and the
stage's own breakdown from store/models/<run>.timings.json when the code under test writes one) and a summary line
with the range of the ratio to stderr. Goal (issue 21): ratio >= 0.8 on 2 CPU cores. Threads: --threads torch threads
for both sides (`torch.set_num_threads`; default 1, the pipeline's own default, and on a shared, loaded machine the
only setting that does not measure threads spinning for cores; set OMP_NUM_THREADS to the same number). The store's
reader uses its own thread pool (one thread per core) either way.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import yaml  # noqa: E402
from gpu_smoke import bare_steps, sync  # noqa: E402

from pipeline.config import load_params  # noqa: E402
from pipeline.paths import Layout  # noqa: E402
from pipeline.training.device import device_name, resolve_device  # noqa: E402


def project(args: argparse.Namespace, root: Path) -> None:
    """The synthetic project (data and extract stages run) with one TopK cell; reused when params match."""
    params = {
        "seed": 0,
        "data": {"source": "synthetic", "n": args.n, "d": args.d, "families": 28, "values": 11, "n_pairs": min(1000, args.n // 20)},
        "train": {"batch_size": args.batch, "epochs": 1, "max_steps": args.steps, "lr": 5e-4, "device": args.device, "feed": args.feed},
        "sweep": {"rotation": {"methods": ["identity"], "ks": [min(args.k, args.d)]}, "sae": {"methods": ["topk"], "dict_sizes": [args.dict], "ks": [args.k]}},
        "methods": {"identity": {}, "topk": {}},
        "evaluate": {"ks": [args.k]},
    }
    if args.feed == "auto":  # code from before the feed settings existed must accept the file
        del params["train"]["feed"]
    text = yaml.safe_dump(params, sort_keys=False)
    root.mkdir(parents=True, exist_ok=True)
    if (root / "params.yaml").exists() and (root / "params.yaml").read_text() == text and (root / "store/embeddings/images.zarr").exists():
        return
    (root / "params.yaml").write_text(text)
    from stages import data, extract

    p, layout = load_params(root / "params.yaml"), Layout(root)
    start = time.perf_counter()
    data.run(p, layout)
    extract.run(p, layout)
    print(f"bench_feed: project of {args.n} rows written in {time.perf_counter() - start:.0f} s", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200_000, help="synthetic embeddings")
    parser.add_argument("--d", type=int, default=768, help="embedding dimension")
    parser.add_argument("--dict", type=int, default=64, help="SAE latents")
    parser.add_argument("--k", type=int, default=32, help="active latents per row")
    parser.add_argument("--steps", type=int, default=100, help="optimiser steps")
    parser.add_argument("--batch", type=int, default=4096, help="rows per step")
    parser.add_argument("--repeats", type=int, default=3, help="side-by-side measurements")
    parser.add_argument("--feed", default="auto", choices=["auto", "resident", "streaming"], help="train.feed")
    parser.add_argument("--device", default="cpu", help="train.device")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the stage and the bare loop")
    parser.add_argument("--workdir", type=Path, default=None, help="the project folder (kept; reused when its params match)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import logging

    logging.basicConfig(level=logging.WARNING)
    root = args.workdir or Path(tempfile.mkdtemp(prefix="bench_feed-"))
    project(args, root)
    from pipeline.models.registry import build
    from pipeline.store import open_store
    from pipeline.training.cell_training import train_cell

    p, layout = load_params(root / "params.yaml"), Layout(root)
    cell = p.cells()[-1]
    device = resolve_device(args.device)
    store = open_store(layout.image_embeddings)
    x = torch.as_tensor(store.read(0, min(len(store), args.steps * args.batch)), device=device)
    ratios = []
    for repeat in range(args.repeats):
        shutil.rmtree(layout.model(cell.name), ignore_errors=True)
        layout.model_timings(cell.name).unlink(missing_ok=True) if hasattr(layout, "model_timings") else None
        sync(device)
        start = time.perf_counter()
        train_cell(p, layout, cell)
        sync(device)
        stage = time.perf_counter() - start
        model = build(cell.method, args.d, cell.size, cell.k, seed=0, **p.method_options(cell.method)).to(device)
        model.fit_init(x[:4096])
        bare = bare_steps(model, x, args.steps, args.batch, bf16=False, device=device)  # after its own 10 warm-up steps
        ratios.append(bare / stage)
        record: dict[str, Any] = {"repeat": repeat, "device": device_name(device), "threads": torch.get_num_threads(), "stage_s": round(stage, 3), "bare_s": round(bare, 3),
                                  "ratio": round(bare / stage, 3), "rows": args.steps * args.batch}
        timings = layout.model_timings(cell.name) if hasattr(layout, "model_timings") else None
        if timings is not None and timings.exists():
            detail = json.loads(timings.read_text())
            record.update(feed=detail["feed"], breakdown=detail["seconds"], steps_share=detail["steps_share"])
        print(json.dumps(record), flush=True)
    print(f"bench_feed: stage / warm bare loop ratio {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} repeats "
          f"[goal >= 0.8: {'met' if min(ratios) >= 0.8 else 'NOT met' if max(ratios) < 0.8 else 'met in some repeats'}]", file=sys.stderr)


if __name__ == "__main__":
    main()
