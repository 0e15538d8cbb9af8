"""The planted-structure benchmark: does a learned rotation find a basis that is known to exist?

Embeddings are drawn as z = Q^T s + b + noise with k-sparse s (`pipeline.data.planted`); every rotation method
is fitted by the same training path as the pipeline's stages (`pipeline.training.sparse.fit_array`), then scored
by axis recovery (`pipeline.metrics.recovery`: mean over true axes of the best |cosine| with a learned axis; 1 =
Q found up to a signed permutation) and by FVU at the true k on held-out rows, next to the oracle FVU (top-k in
the true basis: the floor the noise leaves). No I/O.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import torch

from pipeline.data.planted import Planted, planted
from pipeline.metrics.reconstruction import fvu
from pipeline.metrics.recovery import axis_recovery
from pipeline.models.registry import build
from pipeline.models.rotations import topk_abs
from pipeline.scoring.options import PlantedSettings
from pipeline.training.options import TrainSettings
from pipeline.training.sparse import fit_array

log = logging.getLogger(__name__)


def oracle_fvu(data: Planted, k: int) -> float:
    """FVU of top-k in the true basis Q with the true offset b: the noise floor at that k."""
    z = torch.as_tensor((data.x - data.b) @ data.q.T)
    x_hat = topk_abs(z, k).numpy() @ data.q + data.b
    return fvu(data.x, x_hat)


def recovery(d: int, n: int, k: int, noise: float, methods: tuple[str, ...] | list[str], train: TrainSettings,
             options: dict[str, dict[str, Any]], seed: int = 0) -> list[dict[str, Any]]:
    """One planted data set, every method fitted on 80% of it and scored on the rest."""
    data = planted(n, d, k, noise=noise, seed=seed)
    n_train = int(0.8 * n)
    held_out = data.x[n_train:]
    oracle = oracle_fvu(replace(data, x=held_out, s=data.s[n_train:]), k)
    rows = []
    for method in methods:
        model = build(method, d, d, k, seed=seed, **options.get(method, {}))
        fit_array(model, data.x[:n_train], train, seed)
        with torch.no_grad():
            x_hat = model(torch.as_tensor(held_out)).numpy()
        rows.append({"method": method, "d": d, "k": k, "noise": noise, "recovery": axis_recovery(model.rotation, data.q),
                     "fvu": fvu(held_out, x_hat), "oracle_fvu": oracle})
        log.info("planted d=%d k=%d noise=%g %s: recovery %.3f, FVU %.5f (oracle %.5f)", d, k, noise, method,
                 rows[-1]["recovery"], rows[-1]["fvu"], oracle)
    return rows


def benchmark(planted_settings: PlantedSettings, train: TrainSettings, options: dict[str, dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """Every (noise, k) cell of the grid: `recovery` rows, trained with `train` for `planted_settings.epochs`."""
    train = replace(train, epochs=planted_settings.epochs, batch_size=256)
    return [row for noise in planted_settings.noises for k in planted_settings.ks
            for row in recovery(planted_settings.d, planted_settings.n, k, noise, planted_settings.methods, train, options, seed)]


__all__ = ["PlantedSettings", "oracle_fvu", "recovery", "benchmark"]
