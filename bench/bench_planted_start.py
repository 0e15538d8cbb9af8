"""Does an SAE stop short of the planted oracle because training stops short, or because its own objective prefers
other atoms? On planted data (as bench/bench_training_budget.py: d = 32, k = 4, dictionary 2d, 8,000 rows, 80 %
for training) each method of the TopK family is trained twice with the library defaults: from its usual random
initialisation, and from the planted atoms (decoder and encoder rows = the signed true directions, encoder bias 0;
`fit_init` then sets the input scale, the decoder bias and the thresholds as usual). Printed per (method, noise,
seed): the held-out FVU over the oracle's for the model trained from random atoms, for the planted answer (the
planted atoms with the true offset as decoder bias, thresholds estimated on them, no step), and for the model trained
from the planted atoms; and the method's own reconstruction objective (its weighted level or prefix MSEs in the
scaled space, inference codes, no auxiliary loss) on the training and the held-out rows.

Reading: if the randomly started model's training objective is *below* the planted answer's, training did not
stop short of the planted answer: the objective prefers where it went, and its FVU gap is the method's price on
this sample, not a shortfall of the optimiser. If it is above, training stopped in a worse optimum.

Usage: python bench/bench_planted_start.py [--methods matryoshka,matryoshka_prefix,topk] [--noises 0.01,0.1]
       [--d 32] [--k 4] [--n 8000] [--seeds 0]   (about 15 s per trained model on one core at the defaults)
"""

from __future__ import annotations

import argparse
import copy
import logging
from dataclasses import dataclass, replace

import numpy as np
import torch

from pipeline.data.planted import Planted, planted
from pipeline.metrics.reconstruction import fvu
from pipeline.models.registry import build
from pipeline.models.sae import THRESHOLD_SAMPLE_ROWS
from pipeline.models.topk import TopKSAE
from pipeline.scoring.planted import oracle_fvu
from pipeline.training.options import TrainSettings
from pipeline.training.sparse import fit_array

METHODS = "matryoshka,matryoshka_prefix,topk"


@dataclass(frozen=True)
class Outcome:
    ratio: float  # held-out FVU / oracle FVU
    train: float  # the method's reconstruction objective on the training rows
    held: float  # ... on the held-out rows


def objective(model: TopKSAE, x: np.ndarray) -> float:
    """The method's reconstruction objective (`_recon_loss`: the weighted level or prefix MSEs) of x (n, d), with the
    inference codes."""
    with torch.no_grad():
        xs = torch.as_tensor(x, dtype=torch.float32) * model.input_scale
        pre = model.pre_activations(xs)
        codes = model._sparsify(pre, model.k)
        return float(model._recon_loss(xs, pre, codes, model.decode_scaled(codes)))


def outcome(model: TopKSAE, train: np.ndarray, held: np.ndarray, oracle: float) -> Outcome:
    model.eval()
    with torch.no_grad():
        ratio = fvu(held, np.asarray(model.decode(model.encode(held)))) / oracle
    return Outcome(ratio, objective(model, train), objective(model, held))


def planted_atoms(model: TopKSAE, data: Planted) -> None:
    """Decoder and encoder rows = the signed planted directions (+q then -q; the dictionary must be 2d), encoder bias 0."""
    atoms = torch.as_tensor(np.concatenate([data.q, -data.q]), dtype=torch.float32)
    if atoms.shape != model.W_dec.shape:
        raise ValueError(f"planted atoms {tuple(atoms.shape)} do not fit a dictionary of {tuple(model.W_dec.shape)}")
    with torch.no_grad():
        model.W_dec.copy_(atoms)
        model.W_enc.copy_(atoms)
        model.b_enc.zero_()


def compare(method: str, noise: float, d: int, k: int, n: int, seed: int) -> tuple[Outcome, Outcome, Outcome]:
    """(trained from random atoms, the planted answer (planted atoms and the true offset, no step), trained from the
    planted atoms)."""
    data = planted(n, d, k, noise=noise, seed=seed)
    cut = int(0.8 * n)
    train, held = data.x[:cut], data.x[cut:]
    oracle = oracle_fvu(replace(data, x=held, s=data.s[cut:]), k)
    settings = TrainSettings()
    random_start = build(method, d=d, dict_size=2 * d, k=k, seed=seed)
    trained = fit_array(random_start, train, settings, seed).module
    start = build(method, d=d, dict_size=2 * d, k=k, seed=seed)
    planted_atoms(start, data)
    sample = torch.as_tensor(train[: settings.init_samples])
    start.fit_init(sample)
    untrained = copy.deepcopy(start)  # the planted answer itself: the true offset too
    with torch.no_grad():
        untrained.b_dec.copy_(torch.as_tensor(data.b, dtype=torch.float32) * untrained.input_scale)
        untrained._init_sparsifier(untrained.pre_activations(sample[:THRESHOLD_SAMPLE_ROWS] * untrained.input_scale))
    planted_answer = outcome(untrained, train, held, oracle)
    from_planted = fit_array(start.train(), train, settings, seed).module
    return outcome(trained, train, held, oracle), planted_answer, outcome(from_planted, train, held, oracle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=METHODS)
    parser.add_argument("--noises", default="0.01,0.1")
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--n", type=int, default=8000)
    parser.add_argument("--seeds", default="0")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    print(f"planted d={args.d} k={args.k} n={args.n} (train 80 %), dictionary {2 * args.d}, library defaults; "
          "FVU / oracle FVU on the held-out rows, the method's objective on train / held-out rows")
    print(f"{'method':18s} {'noise':>5s} {'seed':>4s} | {'from random':>27s} | {'planted answer, no step':>27s} | {'from planted':>27s} | random's train objective")
    for method in args.methods.split(","):
        for noise in (float(v) for v in args.noises.split(",")):
            for seed in (int(v) for v in args.seeds.split(",")):
                results = compare(method, noise, args.d, args.k, args.n, seed)
                cells = " | ".join(f"{r.ratio:6.2f}x {r.train:9.6f} {r.held:9.6f}" for r in results)
                verdict = "below the planted answer's" if results[0].train < results[1].train else "above the planted answer's"
                print(f"{method:18s} {noise:5g} {seed:4d} | {cells} | {verdict}", flush=True)


if __name__ == "__main__":
    main()
