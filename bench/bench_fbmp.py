"""Benchmark: vectorised FBMP vs a straightforward per-latent reference loop.

    python bench/bench_fbmp.py [--n 20000] [--latents 4096] [--attributes 312] [--seed 0]
    python bench/bench_fbmp.py --sparse-k 32 --n 120000 --latents 16384 --attributes 312

With --sparse-k K the codes are K-sparse per row (K random latents per image, drawn by the same lognormal firing
rates, plus the planted ones) and handed to FBMP as a scipy.sparse CSR matrix, never dense: the issue-13 goal is
FBMP (beta 0.5, k 3) on 120 k x 16,384 sparse codes x 312 attributes in under 5 s on 2 cores. Only the full-size
timings run in that mode (the reference loop needs dense codes).

Prints (1) the FBMP time (beta = 0.5, k = 3) and the one-to-one time at full size on random sparse
activations with planted attribute-aligned latents, and (2) on a subsample, the time of a plain
loop that scores each latent with sklearn.metrics.fbeta_score, the vectorised time on the same
subsample, their ratio, and whether both give identical coalitions. Thread count is whatever the
BLAS gets from the environment (e.g. OMP_NUM_THREADS=2 for "2 cores").
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from scipy import sparse
from sklearn.metrics import f1_score, fbeta_score

from pipeline.metrics.matching import fbmp, one_to_one


def synthetic(n: int, n_latents: int, n_attributes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sparse random activations (median firing rate 32/L, about 60 active latents per image) and labels.

    Attribute a (prevalence 1-20%) is planted on latent a (fires on 85% of positives) for the first
    third of attributes, and split over latents a and a + 1 (half of the positives each) for the
    second third; the rest are unrelated to any latent.
    """
    rng = np.random.default_rng(seed)
    labels = rng.random((n, n_attributes), dtype=np.float32) < rng.uniform(0.01, 0.2, n_attributes).astype(np.float32)
    rate = np.clip(rng.lognormal(np.log(32.0 / n_latents), 0.7, n_latents), 0.0, 0.2).astype(np.float32)
    active = np.empty((n, n_latents), dtype=bool)
    for start in range(0, n, 2048):
        stop = min(start + 2048, n)
        active[start:stop] = rng.random((stop - start, n_latents), dtype=np.float32) < rate
    third = n_attributes // 3
    for a in range(third):
        active[:, a] |= labels[:, a] & (rng.random(n) < 0.85)
    for a in range(third, 2 * third):
        half = rng.random(n) < 0.5
        active[:, a] |= labels[:, a] & half
        active[:, a + 1] |= labels[:, a] & ~half
    return active, labels


def synthetic_sparse(n: int, n_latents: int, n_attributes: int, k: int, seed: int) -> tuple[sparse.csr_array, np.ndarray]:
    """Like `synthetic`, as bool CSR: k latents per image drawn by the same firing rates (with replacement, so a few
    rows have fewer), plus the planted latents of the first two thirds of the attributes."""
    rng = np.random.default_rng(seed)
    labels = rng.random((n, n_attributes), dtype=np.float32) < rng.uniform(0.01, 0.2, n_attributes).astype(np.float32)
    rate = np.clip(rng.lognormal(np.log(32.0 / n_latents), 0.7, n_latents), 0.0, 0.2)
    rows = [np.repeat(np.arange(n), k)]
    cols = [rng.choice(n_latents, size=n * k, p=rate / rate.sum())]
    third = n_attributes // 3
    for a in range(third):
        hit = np.flatnonzero(labels[:, a] & (rng.random(n) < 0.85))
        rows.append(hit), cols.append(np.full(hit.size, a))
    for a in range(third, 2 * third):
        half = rng.random(n) < 0.5
        for latent, side in ((a, half), (a + 1, ~half)):
            hit = np.flatnonzero(labels[:, a] & side)
            rows.append(hit), cols.append(np.full(hit.size, latent))
    r, c = np.concatenate(rows), np.concatenate(cols)
    active = sparse.csr_array((np.ones(r.size, dtype=bool), (r, c)), shape=(n, n_latents))
    active.sum_duplicates()
    return active, labels


def reference_fbmp(active: np.ndarray, labels: np.ndarray, beta: float, k: int) -> list[list[int]]:
    """The FBMP pseudo-code of docs/science.md §3, one sklearn fbeta_score call per latent per step per attribute."""
    coalitions = []
    for a in range(labels.shape[1]):
        y = labels[:, a]
        residual, yhat, chosen = y.copy(), np.zeros_like(y), []
        for step in range(k):
            scores = [fbeta_score(residual, active[:, j], beta=beta, zero_division=0.0) for j in range(active.shape[1])]
            best = int(np.argmax(np.round(scores, 12)))
            residual = residual & ~active[:, best]
            new_hat = yhat | active[:, best]
            if step > 0 and f1_score(y, new_hat, zero_division=0.0) <= f1_score(y, yhat, zero_division=0.0):
                break
            yhat = new_hat
            chosen.append(best)
        coalitions.append(chosen)
    return coalitions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--latents", type=int, default=4096)
    parser.add_argument("--attributes", type=int, default=312)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sub-n", type=int, default=2000)
    parser.add_argument("--sub-latents", type=int, default=256)
    parser.add_argument("--sub-attributes", type=int, default=12)
    parser.add_argument("--sparse-k", type=int, default=None, help="K-sparse CSR codes with K latents per image (full size only)")
    args = parser.parse_args()
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(f"OMP_NUM_THREADS={threads}, os.cpu_count()={os.cpu_count()}")
    if args.sparse_k:
        t0 = time.perf_counter()
        active, labels = synthetic_sparse(args.n, args.latents, args.attributes, args.sparse_k, args.seed)
        print(f"data: {args.n} images x {args.latents} latents (CSR, {active.nnz / args.n:.1f} active per image) x {args.attributes} "
              f"attributes ({labels.sum(1).mean():.1f} per image), made in {time.perf_counter() - t0:.1f} s")
        for _ in range(2):  # the second run is warm
            t0, c0 = time.perf_counter(), time.process_time()
            full = fbmp(active, labels, beta=0.5, k=3)
            t_full, c_full = time.perf_counter() - t0, time.process_time() - c0
        t0 = time.perf_counter()
        o2o = one_to_one(active, labels)
        # CPU time next to wall time: on a shared machine the wall time includes waiting for a core
        print(f"FBMP beta=0.5 k=3 on sparse codes: {t_full:.2f} s wall, {c_full:.2f} s CPU (one-to-one: {time.perf_counter() - t0:.2f} s); "
              f"MATCHScore {full.score:.4f} vs one-to-one {o2o.score:.4f}")
        return

    t0 = time.perf_counter()
    active, labels = synthetic(args.n, args.latents, args.attributes, args.seed)
    print(f"data: {args.n} images x {args.latents} latents x {args.attributes} attributes, "
          f"mean active latents/image {active.sum(1).mean():.1f} (made in {time.perf_counter() - t0:.1f} s)")

    t0 = time.perf_counter()
    full = fbmp(active, labels, beta=0.5, k=3)
    t_full = time.perf_counter() - t0
    t0 = time.perf_counter()
    o2o = one_to_one(active, labels)
    t_o2o = time.perf_counter() - t0
    sizes = np.bincount([c.size for c in full.coalitions], minlength=4)[1:]
    print(f"FBMP beta=0.5 k=3, full size: {t_full:.2f} s   (one-to-one: {t_o2o:.2f} s)")
    print(f"  MATCHScore FBMP {full.score:.4f} vs one-to-one {o2o.score:.4f}; coalition sizes 1/2/3: {sizes.tolist()}")

    # Subsample: the planted latents and attributes are kept, so coalitions are non-trivial.
    rng = np.random.default_rng(args.seed + 1)
    rows = np.sort(rng.choice(args.n, size=args.sub_n, replace=False))
    third = args.attributes // 3
    attrs = np.concatenate([np.arange(args.sub_attributes // 3), third + np.arange(args.sub_attributes // 3),
                            2 * third + np.arange(args.sub_attributes - 2 * (args.sub_attributes // 3))])
    planted = np.unique(np.concatenate([attrs, attrs + 1]))
    others = np.setdiff1d(np.arange(args.latents), planted)
    cols = np.sort(np.concatenate([planted, rng.choice(others, size=args.sub_latents - planted.size, replace=False)]))
    sub_active, sub_labels = np.ascontiguousarray(active[np.ix_(rows, cols)]), np.ascontiguousarray(labels[np.ix_(rows, attrs)])

    t0 = time.perf_counter()
    ref = reference_fbmp(sub_active, sub_labels, beta=0.5, k=3)
    t_ref = time.perf_counter() - t0
    repeats = 20
    t0 = time.perf_counter()
    for _ in range(repeats):
        fast = fbmp(sub_active, sub_labels, beta=0.5, k=3)
    t_fast = (time.perf_counter() - t0) / repeats
    same = [c.tolist() for c in fast.coalitions] == ref
    print(f"subsample {args.sub_n} x {args.sub_latents} x {args.sub_attributes}: reference loop {t_ref:.2f} s, "
          f"vectorised {t_fast * 1e3:.2f} ms, speed ratio {t_ref / t_fast:.0f}x, identical coalitions: {same}")
    scale = (args.latents / args.sub_latents) * (args.attributes / args.sub_attributes)
    print(f"  reference loop at full size would take at least ~{t_ref * scale / 3600:.1f} h (latents x attributes scaling only)")
    if not same:
        raise SystemExit("coalitions differ between the vectorised FBMP and the reference loop")


if __name__ == "__main__":
    main()
