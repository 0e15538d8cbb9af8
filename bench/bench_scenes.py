"""Throughput of the procedural scene world, measured side by side in one run (one core).

    OMP_NUM_THREADS=1 python bench/bench_scenes.py [--n 400] [--pairs 100]

Prints images/s for object and multi-object scenes at 64 and 224 px, and pairs/s for both kinds
(a pair re-renders its base image, renders the edit and the coverage masks of both). Target: >= 300
images/s at 64 px (the default offline run renders a few thousand).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from pipeline.data.world import scenes as world
from pipeline.data.world.vocabulary import CATEGORIES, FAMILIES


def _rate(count: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return count / (time.perf_counter() - start), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400, help="images per measurement at 64 px (a quarter at 224 px)")
    parser.add_argument("--pairs", type=int, default=100, help="pairs per measurement")
    args = parser.parse_args()
    world.generate_objects(4)  # warm-up: imports, first allocations
    n_attributes = sum(len(f.values) for f in FAMILIES)
    print(f"world: {len(FAMILIES)} families, {n_attributes} object attributes, {len(CATEGORIES)} categories")
    print(f"{'what':<28}{'64 px':>12}{'224 px':>12}")
    for kind, generate in (("objects", world.generate_objects), ("multi", world.generate_multi)):
        rates = []
        for size, n in ((64, args.n), (224, max(args.n // 4, 1))):
            rate, _ = _rate(n, lambda: generate(n, image_size=size, seed=1))
            rates.append(rate)
        print(f"{kind + ' images/s':<28}{rates[0]:>12.0f}{rates[1]:>12.0f}")
    for kind, generate, pairs in (("objects", world.generate_objects, world.object_pairs), ("multi", world.generate_multi, world.multi_pairs)):
        rates = []
        for size, n_pairs in ((64, args.pairs), (224, max(args.pairs // 4, 1))):
            scenes = generate(n_pairs, image_size=size, seed=2, split=(0.0, 0.0, 1.0))
            rate, _ = _rate(n_pairs, lambda: pairs(scenes, n_pairs, seed=0))
            rates.append(rate)
        print(f"{kind + ' pairs/s':<28}{rates[0]:>12.0f}{rates[1]:>12.0f}")


if __name__ == "__main__":
    main()
