"""Do the library defaults train every sparse model to the planted oracle? Planted data (pipeline.data.planted: d = 32,
exactly k = 4-sparse in a hidden orthonormal basis plus noise, 8,000 rows), every method fitted by the quick helpers
(`fit_sae` with a dictionary of 2d, one latent per signed planted direction; `fit_cedar`), held-out FVU over the
oracle's (top-k in the true basis), at every noise level, side by side in one run under two recipes:

- "published": the budget rule (at least 2,000 steps, lr = 0.5 / sqrt(steps) in [5e-4, 1e-2]) with each SAE as its
  paper trains it (`pipeline.models.options.PUBLISHED`): no resampling (`resample_every=0`; TopK-family: AuxK only),
  the ReLU L0 controller aimed at k exactly (`l0_slack=0`), JumpReLU's trained thresholds kept (`refit_thresholds=0`);
- "defaults": the library defaults (resampling of idle latents onto the residual's principal directions in the first
  half of training, `pipeline.models.sae.SAE`; ReLU's controller aimed 5 % above k, `pipeline.models.penalty.ReLUSAE`;
  JumpReLU's thresholds refitted after training, `pipeline.models.penalty.JumpReLUSAE`).

Prints one line per (method, noise) with both ratios and, per recipe, how many methods end within 2x of the oracle.
With --seeds 0,1,2 each cell is the median over data-and-model seeds (the worst seed is printed beside it).
Usage: python bench/bench_training_budget.py [--noises 0.01,0.1] [--d 32] [--k 4] [--n 8000] [--seeds 0]
(about 15 minutes on one quiet core at the defaults; --d 64 --k 8 is the larger case)
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import replace

import numpy as np
import torch

from pipeline.data.planted import planted
from pipeline.metrics.reconstruction import fvu
from pipeline.models.options import PUBLISHED
from pipeline.scoring.planted import oracle_fvu
from pipeline.training.sparse import fit_cedar, fit_sae

METHODS = ["cedar", "relu", "topk", "batchtopk", "jumprelu", "matryoshka", "matryoshka_prefix"]
RECIPES = ("published", "defaults")


def ratio(method: str, recipe: str, noise: float, d: int, k: int, n: int, seed: int) -> float:
    """Held-out FVU / oracle FVU of one method fitted under one recipe on one planted data set."""
    data = planted(n, d, k, noise=noise, seed=seed)
    cut = int(0.8 * n)
    train, held = data.x[:cut], data.x[cut:]
    options = dict(PUBLISHED.get(method, {})) if recipe == "published" else {}
    if method == "cedar":
        model = fit_cedar(train, k, seed=seed, device="cpu", **options)
    else:
        model = fit_sae(train, method, 2 * d, k, seed=seed, device="cpu", **options)
    with torch.no_grad():
        value = fvu(held, np.asarray(model.decode(model.encode(held))))
    return value / oracle_fvu(replace(data, x=held, s=data.s[cut:]), k)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noises", default="0.01,0.1")
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--n", type=int, default=8000)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--methods", default=",".join(METHODS))
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    noises = [float(v) for v in args.noises.split(",")]
    seeds = [int(v) for v in args.seeds.split(",")]
    methods = args.methods.split(",")
    print(f"planted d={args.d} k={args.k} n={args.n} (train 80 %), dictionary 2d = {2 * args.d}, seeds {seeds}: held-out FVU / oracle FVU")
    for noise in noises:
        data, cut = planted(args.n, args.d, args.k, noise=noise, seed=seeds[0]), int(0.8 * args.n)
        oracle = oracle_fvu(replace(data, x=data.x[cut:], s=data.s[cut:]), args.k)
        print(f"\nnoise {noise}: oracle FVU {oracle:.5f} (seed {seeds[0]})")
        print(f"  {'method':18s} " + "  ".join(f"{r:>22s}" for r in RECIPES))
        within = {r: 0 for r in RECIPES}
        for method in methods:
            cells = []
            for recipe in RECIPES:
                start = time.perf_counter()
                values = [ratio(method, recipe, noise, args.d, args.k, args.n, seed) for seed in seeds]
                median = float(np.median(values))
                within[recipe] += median <= 2
                worst = f" (worst {max(values):5.1f})" if len(values) > 1 else ""
                cells.append(f"{median:6.1f}x{worst} {time.perf_counter() - start:4.0f}s")
            print(f"  {method:18s} " + "  ".join(f"{c:>22s}" for c in cells), flush=True)
        print("  within 2x of the oracle: " + ", ".join(f"{r} {within[r]}/{len(methods)}" for r in RECIPES))


if __name__ == "__main__":
    main()
