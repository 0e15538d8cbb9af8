"""Axis recovery: does a learned basis contain the true axes of planted data (up to sign and order)?"""

from __future__ import annotations

import numpy as np


def axis_recovery(rotation: np.ndarray, q: np.ndarray) -> float:
    """Mean over the true axes (rows of q, (m, d)) of the max |cosine| with the learned axes
    (rows of rotation, (r, d)); 1 = every true axis is found (up to sign and order).

    Rows are normalised, so r may differ from m (e.g. an SAE's decoder directions).
    """
    learned = np.asarray(rotation, dtype=np.float64)
    true = np.asarray(q, dtype=np.float64)
    if learned.ndim != 2 or true.ndim != 2 or learned.shape[1] != true.shape[1]:
        raise ValueError(f"axis_recovery: expected rotation (r, d) and q (m, d) with the same d, got {learned.shape} and {true.shape}")
    if not (np.isfinite(learned).all() and np.isfinite(true).all()):
        raise ValueError("axis_recovery: rotation or q contains NaN or infinite values")
    learned = learned / np.maximum(np.linalg.norm(learned, axis=1, keepdims=True), 1e-300)
    true = true / np.maximum(np.linalg.norm(true, axis=1, keepdims=True), 1e-300)
    return float(np.abs(true @ learned.T).max(axis=1).mean())
