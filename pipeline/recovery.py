"""Planted-structure recovery: does a learned rotation find a basis that is known to exist?

Embeddings are drawn as z = Q^T s + b + noise with k-sparse s (`pipeline.models.planted`); every
rotation method is fitted by the same training loop as the pipeline's stages, then scored by
axis recovery (mean over true axes of the best |cosine| with a learned axis: 1 = Q found up to
signed permutation) and by FVU at the true k on held-out rows, next to the oracle FVU (top-k in
the true basis: the noise floor). No I/O.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from pipeline.metrics.reconstruction import fvu
from pipeline.models import build
from pipeline.models.planted import axis_recovery, oracle_fvu, planted
from pipeline.train import TrainSettings, fit_array

log = logging.getLogger(__name__)


def recovery(d: int, n: int, k: int, noise: float, methods: list[str], settings: TrainSettings,
             options: dict[str, dict[str, Any]], seed: int = 0) -> list[dict[str, Any]]:
    """One planted data set, every method fitted on 80% of it and scored on the rest."""
    data = planted(n, d, k, noise=noise, seed=seed)
    n_train = int(0.8 * n)
    held_out = data.x[n_train:]
    oracle = oracle_fvu(replace(data, x=held_out, s=data.s[n_train:]), k)
    rows = []
    for method in methods:
        model = build(method, d, d, k, seed=seed, **options.get(method, {}))
        fit_array(model, data.x[:n_train], settings)
        with torch.no_grad():
            x_hat = model(torch.as_tensor(held_out)).numpy()
        rows.append({"method": method, "d": d, "k": k, "noise": noise, "recovery": axis_recovery(model.rotation, data.q),
                     "fvu": fvu(held_out, x_hat), "oracle_fvu": oracle})
        log.info("planted d=%d k=%d noise=%g %s: recovery %.3f, FVU %.5f (oracle %.5f)", d, k, noise, method,
                 rows[-1]["recovery"], rows[-1]["fvu"], oracle)
    return rows
