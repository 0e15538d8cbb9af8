"""Do the library defaults train to convergence on small data? Planted data (pipeline.data.planted), every sparse
model fitted by the quick helpers (`fit_sae`, `fit_cedar`), FVU on held-out rows against the oracle (top-k in the
true basis), side by side under two budgets in one run:

- "old defaults": 20 epochs at lr 5e-4 (the published SAE rate, meant for millions of rows), min_steps 0;
- "budget rule": the TrainSettings defaults (at least 2,000 steps, lr = 0.5 / sqrt(steps) clipped to [5e-4, 1e-2]).

Prints one line per (method, budget) and a summary of how many methods end within 2x of the oracle. "relu+rescale" is
the ReLU SAE with its option `rescale` (the L1 shrinkage corrected after training; off by default, as published).
Usage: python bench/bench_training_budget.py [--noise 0.1] [--d 32] [--k 4] [--n 8000]  (about 2 minutes at the defaults)
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
from pipeline.scoring.planted import oracle_fvu
from pipeline.training.sparse import fit_cedar, fit_sae

METHODS = ["cedar", "topk", "relu", "relu+rescale", "batchtopk", "jumprelu", "matryoshka", "matryoshka_prefix"]
BUDGETS = {"old defaults": {"epochs": 20, "lr": 5e-4, "min_steps": 0}, "budget rule": {}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noise", type=float, default=0.1)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--n", type=int, default=8000)
    parser.add_argument("--methods", default=",".join(METHODS))
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    data = planted(args.n, args.d, args.k, noise=args.noise, seed=0)
    cut = int(0.8 * args.n)
    train, held = data.x[:cut], data.x[cut:]
    oracle = oracle_fvu(replace(data, x=held, s=data.s[cut:]), args.k)
    print(f"planted d={args.d} k={args.k} n={args.n} noise={args.noise}: oracle FVU {oracle:.5f}; dictionary 2d = {2 * args.d}")
    within = {name: 0 for name in BUDGETS}
    methods = args.methods.split(",")
    for method in methods:
        for name, budget in BUDGETS.items():
            start = time.perf_counter()
            options = {"device": "cpu", **budget}
            if method == "cedar":
                model = fit_cedar(train, args.k, seed=0, **options)
            elif method == "relu+rescale":  # the ReLU SAE with its shrinkage corrected after training (option `rescale`)
                model = fit_sae(train, "relu", 2 * args.d, args.k, seed=0, rescale=True, **options)
            else:
                model = fit_sae(train, method, 2 * args.d, args.k, seed=0, **options)
            with torch.no_grad():
                value = fvu(held, np.asarray(model.decode(model.encode(held))))
            within[name] += value <= 2 * oracle
            print(f"{method:18s} {name:13s} FVU {value:.5f} = {value / oracle:6.1f}x oracle  ({time.perf_counter() - start:5.1f} s)", flush=True)
    print("within 2x of the oracle: " + ", ".join(f"{name} {count}/{len(methods)}" for name, count in within.items()))


if __name__ == "__main__":
    main()
