"""CEDAR against fixed bases: FVU-vs-K curves of CEDAR (several schedules), PCA and ICA, side by side in one run.

The paper's claim is that the learned rotation dominates fixed bases across K. This benchmark asks whether our
training schedule decides that: for each data set and each trained k it fits PCA, ICA and CEDAR under every
schedule below, evaluates FVU on held-out rows at every K in 1..d (powers of two plus k), and reports whether
CEDAR's curve is at or below PCA's at every K it was trained for (the random-k range [ceil(k/2), k]).

Data: planted embeddings (pipeline.data.planted; d = 32, noise 0.1, k/d = 1/16 .. 3/8) and, with --embeddings,
a real store of embeddings (e.g. the default run's store/embeddings/images.zarr with --data store/data for its
train/test split).

Schedules (Cedar options; all with the training-budget rule's defaults, pipeline.training.schedule):
- default: the shipped options (init "pca": start at the PCA basis and learn a rotation away from it; L1 loss,
  exponential curriculum over half of training, uniform random k)
- identity-init: init "identity" (start at U = I, the original coordinates)
- l2: the default with loss "l2" (the squared error FVU measures)
- identity-init+l2: both changes
Usage: python bench/bench_cedar_bases.py [--ks 2,4,8,12] [--d 32] [--schedules default,identity-init,l2,identity-init+l2]
                                         [--embeddings PATH --data PATH] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch

from pipeline.data.planted import planted
from pipeline.metrics.reconstruction import fvu
from pipeline.models.registry import build
from pipeline.training.options import TrainSettings
from pipeline.training.sparse import fit_array

SCHEDULES = {"default": {}, "identity-init": {"init": "identity"}, "l2": {"loss": "l2"}, "identity-init+l2": {"init": "identity", "loss": "l2"}}


def curve(model, x: np.ndarray, ks: list[int]) -> dict[int, float]:
    with torch.no_grad():
        return {k: fvu(x, np.asarray(model(torch.as_tensor(x), k))) for k in ks}


def datasets(args: argparse.Namespace) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, train rows, held-out rows) of every data set the run compares on."""
    out = []
    if not args.no_planted:
        for k in args.ks:
            data = planted(args.n, args.d, k, noise=args.noise, seed=0)
            cut = int(0.8 * args.n)
            out.append((f"planted d={args.d} k={k} noise={args.noise}", data.x[:cut], data.x[cut:]))
    if args.embeddings:
        from pipeline.data.dataset import open_dataset
        from pipeline.store import open_store

        store, data = open_store(args.embeddings), open_dataset(Path(args.data))
        out.append((f"embeddings {args.embeddings}", store.take(data.rows("train")), store.take(data.rows("test"))))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", default="2,4,8,12", help="trained k (planted: also its true k)")
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--n", type=int, default=8000)
    parser.add_argument("--noise", type=float, default=0.1)
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument("--embeddings", default=None)
    parser.add_argument("--data", default="store/data")
    parser.add_argument("--embedding-ks", default=None, help="trained k on --embeddings (default: --ks)")
    parser.add_argument("--no-planted", action="store_true")
    parser.add_argument("--json", default=None, help="write every curve to this file")
    args = parser.parse_args()
    args.ks = [int(k) for k in args.ks.split(",")]
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    results = []
    for name, train, held in datasets(args):
        d = train.shape[1]
        ks_trained = [int(k) for k in (args.embedding_ks or ",".join(map(str, args.ks))).split(",")] if name.startswith("embeddings") else None
        for k in ks_trained or [int(name.split("k=")[1].split()[0])]:
            grid = sorted({2**e for e in range(int(math.log2(d)) + 1)} | {k, max(1, math.ceil(k / 2))})
            trained_range = [K for K in grid if math.ceil(k / 2) <= K <= k]
            rows = {}
            for method in ("pca", "ica"):
                model = build(method, d, d, k, seed=0)
                model.fit_init(torch.as_tensor(train[:20000]))
                rows[method] = curve(model.eval(), held, grid)
            for schedule in args.schedules.split(","):
                start = time.perf_counter()
                model = build("cedar", d, d, k, seed=0, **SCHEDULES[schedule])
                result = fit_array(model, train, TrainSettings(device="cpu"), seed=0)
                rows[f"cedar {schedule}"] = curve(result.module, held, grid)
                rows[f"cedar {schedule}"]["seconds"] = time.perf_counter() - start
            print(f"\n{name}, trained k = {k} (trained range K = {trained_range[0]}..{trained_range[-1]})")
            print(f"{'':22s}" + "".join(f"K={K:<9d}" for K in grid))
            for label, values in rows.items():
                verdict = ""
                if label.startswith("cedar"):
                    at_or_below = all(values[K] <= rows["pca"][K] * (1 + 1e-9) for K in trained_range)
                    verdict = f"  <= PCA on the trained range: {'yes' if at_or_below else 'NO'}  ({values['seconds']:.0f} s)"
                print(f"{label:22s}" + "".join(f"{values[K]:<11.5f}" for K in grid) + verdict)
            results.append({"data": name, "k": k, "grid": grid, "curves": {label: {str(K): v for K, v in values.items() if K != "seconds"}
                                                                         for label, values in rows.items()}})
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
