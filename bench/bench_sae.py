"""Benchmark: SAE training throughput per method, and the TopK step's fraction of the matmul peak.

    python bench/bench_sae.py [--d 512] [--dict 4096] [--k 32] [--batch 256] [--steps 20] [--device auto]

For each SAE method, times full training steps as `pipeline.training.loop` runs them (training_loss,
backward, gradient clipping, before_step, Adam step, after_step) on random Gaussian inputs and
prints embeddings/s. In the same run it measures a plain float32 (n x n) @ (n x n) matmul
(GFLOP/s) and reports the fraction of it the TopK step reaches, counting the six dense matmuls of
a step: encoder and decoder forward (2 * batch * dict * d FLOPs each) and their two backward
matmuls each (grad of input and of weight). AuxK is kept off (dead_steps larger than the run), so
these counts are the whole matmul work; with dead latents AuxK adds one decoder matmul and its
backward. Thread count is whatever torch gets from the environment (e.g. OMP_NUM_THREADS=1).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from pipeline.models.registry import build
from pipeline.training.device import resolve_device

METHODS = ["relu", "topk", "batchtopk", "jumprelu", "matryoshka", "matryoshka_prefix"]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_gflops(device: torch.device, n: int, repeats: int, trials: int = 5) -> float:
    """Float32 GFLOP/s of an (n x n) @ (n x n) matmul (2 n^3 FLOPs): the best of `trials` timings of
    `repeats` products, after one warm-up (best-of, because other processes share the machine)."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    a @ b
    sync(device)
    best = 0.0
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(repeats):
            a @ b
        sync(device)
        best = max(best, 2 * n**3 * repeats / (time.perf_counter() - t0) / 1e9)
    return best


#: the training progress the steps are timed at: inside the first half, where an SAE records its residual for
#: resampling (a d x d update per step; the rounds themselves, one eigendecomposition every 5 % of training, are
#: not timed)
PROGRESS = 0.01


def step_seconds(method: str, d: int, size: int, k: int, batch: int, steps: int, device: torch.device) -> float:
    """Median seconds of one full training step (after 3 warm-up steps; median, because other
    processes share the machine). On CUDA, steps are timed in blocks of 5 to keep launches queued."""
    model = build(method, d=d, dict_size=size, k=k, seed=0, dead_steps=10**9).to(device)
    x = torch.randn(max(4 * batch, 4096), d, device=device)
    model.fit_init(x)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-4)
    generator = torch.Generator(device=device).manual_seed(0)

    def one_step(i: int) -> None:
        xb = x[(i * batch) % (len(x) - batch) :][:batch]
        loss, stats = model.training_loss(xb, PROGRESS, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        model.before_step()
        optimizer.step()
        model.after_step()

    for i in range(3):
        one_step(i)
    block = 5 if device.type == "cuda" else 1
    times = []
    for start in range(0, steps, block):
        sync(device)
        t0 = time.perf_counter()
        for i in range(start, start + block):
            one_step(i)
        sync(device)
        times.append((time.perf_counter() - t0) / block)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--dict", type=int, default=4096, dest="size")
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--methods", default=",".join(METHODS))
    args = parser.parse_args()
    device = resolve_device(args.device)
    print(f"device={device}, torch threads={torch.get_num_threads()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
          f"d={args.d}, dict={args.size}, k={args.k}, batch={args.batch}, timed steps={args.steps}")
    n = 8192 if device.type == "cuda" else 1024
    peak = matmul_gflops(device, n, repeats=20 if device.type == "cuda" else 3)
    print(f"plain float32 matmul {n}x{n} (best of 5): {peak:.1f} GFLOP/s; step times below are medians")
    step_flops = 6 * 2 * args.batch * args.size * args.d
    print(f"{'method':>18} {'ms/step':>9} {'embeddings/s':>13} {'matmul GFLOP/s':>15} {'of peak':>8}")
    for method in args.methods.split(","):
        seconds = step_seconds(method, args.d, args.size, args.k, args.batch, args.steps, device)
        gflops = step_flops / seconds / 1e9
        print(f"{method:>18} {seconds * 1e3:9.2f} {args.batch / seconds:13.0f} {gflops:15.1f} {gflops / peak:8.1%}")
    print("(GFLOP/s and 'of peak' count the 6 encoder/decoder matmuls of a plain step; they are exact for topk and\n"
          " batchtopk, a lower bound for matryoshka (one decoder matmul per level) and for relu/jumprelu, whose\n"
          " extra elementwise work is not counted)")


if __name__ == "__main__":
    main()
