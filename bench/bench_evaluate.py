"""Benchmark: the evaluate stage of one cell against encoding its rows with the same model, side by side in one run.

    python bench/bench_evaluate.py [--n 20000] [--d 768] [--dict 4096] [--k 32] [--steps 200] [--batch 256]
                                   [--device auto] [--workdir DIR] [--reuse] [--repeat 1]

A synthetic project (the `synthetic` source: --n embeddings of dimension --d, 28 one-hot families of 11 values =
308 planted concepts; evaluate at the defaults but `ks: [k]`) with a TopK SAE cell (--dict latents, k) and a CEDAR
cell (d axes, k), each trained --steps steps. For each cell, in this one process and on one device:

- `encode`: both models of the cell (the trained one and its untrained twin, `pipeline.scoring.cell_evaluation.untrained_twin`)
  encode the rows the evaluation encodes for its metrics: the test split and the matching rows (`concept_data`'s
  `max_match_rows` subsample of the training split), already in memory, in batches of `evaluate.batch_size`
  (`SparseModel.encode`, the codes brought back to the host as CSR) -- the bare work of encoding;
- `evaluate`: the evaluate stage (`stages.evaluate.run`: every metric and the explanations, the codes written and
  read back; the cell's code sets deleted first, so that it encodes everything), its seconds per part from the
  timings file it writes;
- `encode` again, so that a change of machine load during the run shows.

With `--repeat N`, the evaluation and the encoding after it run N times (each evaluation between two encodings, its
ratio against their mean): on a shared machine whose speed drifts by 10-20 % within minutes, one ratio is one draw.

The linear probes are not a cell's work: the probes stage fits them once per dataset for every cell of a sweep
(`stages.probes`). It runs once before the cells, and its seconds are printed on a line of their own.

Output: one JSON line for the probes stage, then one per cell: seconds of every encoding and evaluation, each timed
part of the first evaluation, and `ratio` = the first evaluation / the mean of the encodings around it (the issue's
goal: <= 5 on 2 CPU cores); with --repeat, every evaluation's ratio, their median, and each part's median seconds.
Threads: whatever torch and BLAS get from the environment (OMP_NUM_THREADS=2 for "2 cores").
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

import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from pipeline.config import load_params  # noqa: E402
from pipeline.paths import Layout  # noqa: E402
from pipeline.training.device import device_name, resolve_device  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def project(args: argparse.Namespace, workdir: Path) -> Path:
    """The synthetic project with the two cells; data, encoder, extract and captions done."""
    from stages import captions, data, encoder, extract, probes

    root = workdir / "bench_evaluate"
    root.mkdir(parents=True, exist_ok=True)
    params = {
        "seed": 0,
        "data": {"source": "synthetic", "n": args.n, "d": args.d, "families": 28, "values": 11, "n_pairs": min(1000, args.n // 20)},
        "train": {"batch_size": args.batch, "epochs": 1, "max_steps": args.steps, "lr": 5e-4, "device": args.device},
        "sweep": {"rotation": {"methods": ["cedar"], "ks": [args.k]}, "sae": {"methods": ["topk"], "dict_sizes": [args.dict], "ks": [args.k]}},
        "methods": {"cedar": {"train": {"lr": 0.01}}, "topk": {}},
        "evaluate": {"ks": [args.k], "device": args.device},
        "captions": {"width": 32, "layers": 1, "heads": 2, "max_pairs": 2000, "device": args.device, "train": {"epochs": 1, "batch_size": 256}},
        "explain": {"caption_images": 100},
        "report": {"title": "bench_evaluate"},
    }
    text = yaml.safe_dump(params, sort_keys=False)
    if args.reuse and (root / "params.yaml").exists() and (root / "params.yaml").read_text() == text and Layout(root).probes.exists():
        return root  # the same project, already built
    (root / "params.yaml").write_text(text)
    p, layout = load_params(root / "params.yaml"), Layout(root)
    for stage in (data, encoder, extract, captions, probes):
        stage.run(p, layout)
    return root


@torch.no_grad()
def bare_encode(models: list[Any], x: np.ndarray, batch_size: int, device: torch.device) -> float:
    """Seconds to encode the rows `x` (already in memory) with every model, batch by batch, codes back as CSR."""
    from pipeline.models.base import tensor_csr

    sync(device)
    start = time.perf_counter()
    for model in models:
        for i in range(0, len(x), batch_size):
            tensor_csr(model.encode(torch.as_tensor(x[i : i + batch_size]).to(device)))
    sync(device)
    return time.perf_counter() - start


def measure(root: Path, device: torch.device, repeat: int = 1) -> None:
    from pipeline.data.dataset import open_dataset
    from pipeline.models.checkpoint import load_model
    from pipeline.scoring.cell_evaluation import concept_data, untrained_twin
    from pipeline.store import open_store
    from pipeline.training.cell_training import train_cell
    from stages import evaluate, probes

    p, layout = load_params(root / "params.yaml"), Layout(root)
    sync(device)
    start = time.perf_counter()
    probes.run(p, layout)  # once per dataset, for every cell
    sync(device)
    print(json.dumps({"stage": "probes", "device": device_name(device), "threads": torch.get_num_threads(),
                      "seconds": round(time.perf_counter() - start, 2)}), flush=True)
    for cell in reversed(p.cells()):  # the SAE first, then CEDAR
        train_cell(p, layout, cell)
        data, store = open_dataset(layout.data), open_store(layout.image_embeddings)
        model = load_model(layout.model(cell.name)).to(device).eval()
        twin = untrained_twin(cell, model.d, p.method_options(cell.method), store, data.rows("train"),
                              p.train_settings(cell.method).init_samples, p.seed).to(device).eval()
        match = np.unique(np.concatenate([concept_data(data, store, kind, p.evaluate, p.seed).match_rows for kind in data.kinds]))
        rows = np.concatenate([data.rows("test"), match])
        x = store.take(np.sort(rows)).astype(np.float32)
        bare_encode([model, twin], x, p.evaluate.batch_size, device)  # warm-up: a whole pass (one batch left the first timed pass ~30 % slow)
        encodes = [bare_encode([model, twin], x, p.evaluate.batch_size, device)]
        stages, ratios, timings = [], [], []
        for _ in range(repeat):  # evaluate, then encode again: each evaluation between two encodings
            shutil.rmtree(layout.codes(cell.name), ignore_errors=True)  # the evaluation encodes everything, as the first time
            sync(device)
            start = time.perf_counter()
            evaluate.run(p, layout, cell)
            sync(device)
            stages.append(time.perf_counter() - start)
            encodes.append(bare_encode([model, twin], x, p.evaluate.batch_size, device))
            ratios.append(stages[-1] / ((encodes[-2] + encodes[-1]) / 2))
            timings_path = layout.run_timings(cell.name)
            timings.append(json.loads(timings_path.read_text()) if timings_path.exists() else {})
        record = {"cell": cell.name, "device": device_name(device), "threads": torch.get_num_threads(), "rows_encoded": 2 * len(x),
                  "encode_s": [round(e, 2) for e in encodes], "evaluate_s": [round(e, 2) for e in stages], "ratio": round(ratios[0], 2),
                  "timings": timings[0]}
        if repeat > 1:
            record.update(ratios=[round(r, 2) for r in ratios], ratio_median=round(float(np.median(ratios)), 2),
                          timings_median={part: round(float(np.median([t.get(part, np.nan) for t in timings])), 3) for part in timings[0]})
        print(json.dumps(record), flush=True)


def add_project_options(parser: argparse.ArgumentParser, device: str) -> None:
    """The options `project` reads (the synthetic project and its two cells), and --workdir; `device`: the default."""
    parser.add_argument("--n", type=int, default=20_000, help="synthetic embeddings")
    parser.add_argument("--d", type=int, default=768, help="embedding dimension")
    parser.add_argument("--dict", type=int, default=4096, help="TopK SAE latents")
    parser.add_argument("--k", type=int, default=32, help="active latents per row (TopK and CEDAR)")
    parser.add_argument("--steps", type=int, default=200, help="optimiser steps per training")
    parser.add_argument("--batch", type=int, default=256, help="rows per step")
    parser.add_argument("--device", default=device, help="auto, cpu, cuda, cuda:1 (training and evaluation, FMS included)")
    parser.add_argument("--workdir", type=Path, default=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_project_options(parser, device="auto")
    parser.add_argument("--reuse", action="store_true", help="keep a project of the same params already in --workdir (trained models too)")
    parser.add_argument("--repeat", type=int, default=1, help="evaluations per cell, each between two encodings (ratio: the first; ratio_median: all)")
    args = parser.parse_args()
    device = resolve_device(args.device)
    args.device = str(device)
    start = time.perf_counter()
    root = project(args, args.workdir or Path(tempfile.mkdtemp(prefix="bench_evaluate-")))
    if args.repeat < 1:
        parser.error(f"--repeat: expected >= 1, got {args.repeat}")
    measure(root, device, args.repeat)
    print(f"bench_evaluate: {time.perf_counter() - start:.0f} s in all", file=sys.stderr)


if __name__ == "__main__":
    main()
