"""The planted-structure benchmark: does a method find a sparse basis that is known to exist?

Embeddings are drawn as z = Q^T s + b + noise with k-sparse s (`pipeline.data.planted`); every method of the
benchmark, the rotations (CEDAR and its fixed bases) and the SAEs (with a dictionary of `dict_ratio` x d latents: 2
gives one latent per signed planted direction), is fitted by the same training path as the pipeline's stages
(`pipeline.training.sparse.fit_array`, with the method's own loop settings and, where they list several learning
rates, the best one on the validation split, `pipeline.training.lr_axis`), then scored on held-out rows: FVU at the
true k next to the oracle's (top-k in the true basis: the floor the noise leaves) and their ratio, and axis recovery
(`pipeline.metrics.recovery`: mean over the true axes of the best |cosine| with a learned axis, a rotation's rows or
an SAE's decoder atoms; 1 = every true axis found up to sign). No I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from pipeline.data.planted import Planted, planted
from pipeline.metrics.reconstruction import fvu
from pipeline.metrics.recovery import axis_recovery
from pipeline.models.base import SparseModel
from pipeline.models.options import ROTATION_METHODS
from pipeline.models.registry import build
from pipeline.models.rotations import topk_abs
from pipeline.scoring.options import PlantedSettings
from pipeline.training.lr_axis import train_lr_axis
from pipeline.training.options import TrainSettings
from pipeline.training.sparse import fit_array

log = logging.getLogger(__name__)


def oracle_fvu(data: Planted, k: int) -> float:
    """FVU of top-k in the true basis Q with the true offset b: the noise floor at that k."""
    z = torch.as_tensor((data.x - data.b) @ data.q.T)
    x_hat = topk_abs(z, k).numpy() @ data.q + data.b
    return fvu(data.x, x_hat)


def learned_axes(model: SparseModel) -> np.ndarray:
    """(r, d) the directions a model codes along: a rotation's axes, an SAE's decoder atoms."""
    if model.method in ROTATION_METHODS:
        return np.asarray(model.rotation)  # type: ignore[attr-defined]
    return model.W_dec.detach().cpu().numpy()  # type: ignore[attr-defined]


def fit_method(method: str, x: np.ndarray, d: int, dict_size: int, k: int, candidates: Sequence[TrainSettings], options: dict[str, Any],
               seed: int) -> tuple[SparseModel, Any]:
    """A model of `method` fitted on x (n, d) with each candidate's loop settings, the best kept on `fit_array`'s
    validation split; returns (model, the learning rate kept)."""
    def train_one(settings: TrainSettings, _: Any) -> Any:
        return fit_array(build(method, d, dict_size, k, seed=seed, **options), x, settings, seed)

    choice = train_lr_axis(candidates, train_one)
    return choice.result.module, choice.settings.lr  # type: ignore[return-value]


def recovery(d: int, n: int, k: int, noise: float, methods: Sequence[str], train: dict[str, Sequence[TrainSettings]],
             options: dict[str, dict[str, Any]], seed: int = 0, dict_ratio: int = 2) -> list[dict[str, Any]]:
    """One planted data set, every method fitted on 80% of it and scored on the rest. train: method -> its loop
    settings (one per learning-rate candidate)."""
    data = planted(n, d, k, noise=noise, seed=seed)
    n_train = int(0.8 * n)
    held_out = data.x[n_train:]
    oracle = oracle_fvu(replace(data, x=held_out, s=data.s[n_train:]), k)
    rows = []
    for method in methods:
        size = d if method in ROTATION_METHODS else dict_ratio * d
        model, lr = fit_method(method, data.x[:n_train], d, size, k, train[method], options.get(method, {}), seed)
        with torch.no_grad():
            x_hat = np.asarray(model.decode(model.encode(held_out)))
        value = fvu(held_out, x_hat)
        rows.append({"method": method, "family": "rotation" if method in ROTATION_METHODS else "sae", "d": d, "k": k, "noise": noise,
                     "n": n, "dict_size": size, "lr": lr, "recovery": axis_recovery(learned_axes(model), data.q), "fvu": value,
                     "oracle_fvu": oracle, "fvu_ratio": value / oracle if oracle > 0 else None})
        log.info("planted d=%d k=%d noise=%g %s: recovery %.3f, FVU %.5f (oracle %.5f, %.2fx)", d, k, noise, method,
                 rows[-1]["recovery"], value, oracle, value / max(oracle, 1e-30))
    return rows


def benchmark(planted_settings: PlantedSettings, train: dict[str, Sequence[TrainSettings]], options: dict[str, dict[str, Any]],
              seed: int) -> list[dict[str, Any]]:
    """Every (noise, k) cell of the grid: `recovery` rows, each method trained with its own settings (`train`: method
    -> candidates) for `planted_settings.epochs` at batch 256."""
    train = {m: [replace(s, epochs=planted_settings.epochs, batch_size=256) for s in candidates] for m, candidates in train.items()}
    return [row for noise in planted_settings.noises for k in planted_settings.ks
            for row in recovery(planted_settings.d, planted_settings.n, k, noise, planted_settings.methods, train, options, seed,
                                planted_settings.dict_ratio)]


__all__ = ["PlantedSettings", "oracle_fvu", "learned_axes", "fit_method", "recovery", "benchmark"]
