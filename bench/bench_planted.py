"""Planted-structure benchmark: does CEDAR find a hidden sparse basis, and how does that degrade?

    python bench/bench_planted.py                 # d = 64, about 5 minutes on one CPU core
    python bench/bench_planted.py --d 32 --n 8000 --epochs 10   # quicker

Data: `pipeline.models.planted.planted` (embeddings exactly k-sparse in a Haar-random basis Q,
plus Gaussian noise). Printed side by side, from one run:
1. at (d, k = d/8, noise 0.01): axis recovery (1 = Q found up to signed permutation), FVU at
   the true k, and max |U U^T - I| for CEDAR (three parametrizations) and the baselines,
   with the oracle FVU (top-k in the true basis: the noise floor);
2. CEDAR and ICA as the noise grows (k = d/8);
3. CEDAR (identity and random init) and ICA as k/d grows (noise 0.01);
4. the same with a Zipf-like support (a few axes common, most rare).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from pipeline.data.planted import Planted, planted  # noqa: E402
from pipeline.metrics.reconstruction import fvu  # noqa: E402
from pipeline.metrics.recovery import axis_recovery  # noqa: E402
from pipeline.models.registry import build  # noqa: E402
from pipeline.scoring.planted import oracle_fvu  # noqa: E402
from pipeline.training.sparse import fit_cedar as fit  # noqa: E402


def evaluate(model, data: Planted, k: int) -> tuple[float, float, float]:
    """(axis recovery, FVU at k, max |U U^T - I|)."""
    u = model.rotation.astype(np.float64)
    x_hat = model.decode(model.encode(data.x, k=k))
    return axis_recovery(u, data.q), fvu(data.x, x_hat), float(np.abs(u @ u.T - np.eye(len(u))).max())


def baseline(method: str, data: Planted, k: int):
    d = data.x.shape[1]
    model = build(method, d=d, dict_size=d, k=k, seed=0)
    model.fit_init(torch.as_tensor(data.x))
    return model.eval()


def cedar(data: Planted, k: int, epochs: int, **options):
    return fit(data.x, k, seed=0, epochs=epochs, **options)


def row(name: str, values: tuple[float, ...], seconds: float | None = None) -> str:
    rec, f, orth = values
    timing = f"{seconds:7.1f}s" if seconds is not None else " " * 8
    return f"  {name:<22} recovery {rec:6.3f}   FVU@k {f:9.5f}   max|UU^T-I| {orth:8.1e} {timing}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    d, n, epochs = args.d, args.n, args.epochs
    k0 = max(1, d // 8)
    torch.set_num_threads(max(1, torch.get_num_threads()))

    print(f"== 1. methods at d={d}, k={k0}, noise=0.01, uniform support, n={n}, CEDAR {epochs} epochs (lr 1e-2)")
    data = planted(n, d, k0, noise=0.01, seed=0)
    print(f"  {'oracle (true Q)':<22} recovery  1.000   FVU@k {oracle_fvu(data, k0):9.5f}")
    for parametrization in ("expm", "cayley", "householder"):
        start = time.perf_counter()
        model = cedar(data, k0, epochs, parametrization=parametrization)
        print(row(f"cedar[{parametrization}]", evaluate(model, data, k0), time.perf_counter() - start))
    for method in ("ica", "pca", "identity", "random_rotation"):
        start = time.perf_counter()
        model = baseline(method, data, k0)
        print(row(method, evaluate(model, data, k0), time.perf_counter() - start))

    print(f"\n== 2. noise sweep (d={d}, k={k0}): CEDAR[expm] vs ICA vs oracle FVU")
    for noise in (0.0, 0.03, 0.1, 0.3):
        data = planted(n, d, k0, noise=noise, seed=0)
        c = evaluate(cedar(data, k0, epochs), data, k0)
        i = evaluate(baseline("ica", data, k0), data, k0)
        print(f"  noise {noise:4.2f}: oracle FVU {oracle_fvu(data, k0):8.5f} | cedar rec {c[0]:.3f} FVU {c[1]:8.5f} | ica rec {i[0]:.3f} FVU {i[1]:8.5f}")

    print(f"\n== 3. k/d sweep (d={d}, noise 0.01): CEDAR[expm] from U = I (default) and from a random U, vs ICA")
    for k in sorted({max(1, d // 32), d // 16, d // 8, d // 4, 3 * d // 8, d // 2} - {0}):
        data = planted(n, d, k, noise=0.01, seed=0)
        c = evaluate(cedar(data, k, epochs), data, k)
        r = evaluate(cedar(data, k, epochs, init="random"), data, k)
        i = evaluate(baseline("ica", data, k), data, k)
        print(
            f"  k={k:3d} (k/d {k / d:.3f}): oracle FVU {oracle_fvu(data, k):8.5f} | cedar rec {c[0]:.3f} FVU {c[1]:8.5f}"
            f" | cedar[init=random] rec {r[0]:.3f} FVU {r[1]:8.5f} | ica rec {i[0]:.3f} FVU {i[1]:8.5f}"
        )

    print(f"\n== 4. Zipf-like support (exponent 1), d={d}, k={k0}")
    for noise in (0.01, 0.1):
        data = planted(n, d, k0, noise=noise, seed=0, support="zipf")
        parts = [f"  noise {noise:4.2f}: oracle FVU {oracle_fvu(data, k0):8.5f}"]
        for name, model in [("cedar", cedar(data, k0, epochs)), ("ica", baseline("ica", data, k0)), ("pca", baseline("pca", data, k0))]:
            rec, f, _ = evaluate(model, data, k0)
            parts.append(f"{name} rec {rec:.3f} FVU {f:8.5f}")
        print(" | ".join(parts))


if __name__ == "__main__":
    main()
