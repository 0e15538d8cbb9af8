"""Training-step time of CEDAR against a TopK SAE of dictionary size d, measured side by side.

    python bench/bench_cedar_step.py                       # d = 512, batches 256 1024 4096, k = 32, 1 CPU thread
    python bench/bench_cedar_step.py --d 768 --threads 2 --batch 1024
    python bench/bench_cedar_step.py --device cuda

One step = forward + backward + Adam step on the same batch. For each CEDAR parametrization
(expm, cayley, householder) it prints the step time, its ratio to the TopK step, and the share
of the step spent in the orthogonal map A -> U (its forward + backward alone, timed separately).
The TopK step is `pipeline.models.sae.TopKSAE` when that module exists, else the plain TopK SAE
written below (encoder, top-k ReLU, decoder, MSE; printed as well, for reference). Timings are
interleaved round-robin and the best of the repeats is reported: on a shared machine the
minimum is the least disturbed estimate of each step's own cost.

Why the batch size is part of the answer: a TopK step of dictionary d costs about five (batch, d) x
(d, d) matmuls, 5 B d^2 multiply-adds, while any exact orthogonal map A -> U costs a fixed number of
(d, d) x (d, d) products per step, c d^3, whatever the batch (Cayley: an inverse forward and two
products backward, c ~ 3.6 measured at d = 512; expm: a degree-13/18 Pade approximant with squarings
forward and the same on a 2d x 2d block backward, c ~ 47 measured). The ratio is therefore about 1 + c d / (5 B): at d = 512 and
B = 256 no exact map can stay within 1.5x (that needs c <= 1.25), while the same map amortised over
a larger batch can. The script prints the ratio for each batch of `--batch` so that trade-off is
measured, not assumed.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch import Tensor, nn

from pipeline.models.cedar import ORTHOGONAL_MAPS, Cedar


class PlainTopK(nn.Module):
    """Reference TopK SAE step: pre = (x - b_dec) W_enc + b_enc, keep the k largest (ReLU), decode."""

    def __init__(self, d: int, m: int, k: int) -> None:
        super().__init__()
        self.k = k
        self.w_dec = nn.Parameter(torch.randn(m, d) / d**0.5)
        self.w_enc = nn.Parameter(self.w_dec.detach().T.clone())
        self.b_enc = nn.Parameter(torch.zeros(m))
        self.b_dec = nn.Parameter(torch.zeros(d))

    def training_loss(self, x: Tensor, progress: float, generator: torch.Generator) -> tuple[Tensor, dict[str, Tensor]]:
        pre = (x - self.b_dec) @ self.w_enc + self.b_enc
        values, index = pre.topk(self.k, dim=1)
        codes = torch.zeros_like(pre).scatter(1, index, values.relu())
        loss = ((codes @ self.w_dec + self.b_dec - x) ** 2).sum(1).mean()
        return loss, {"l0": torch.tensor(float(self.k))}

    def before_step(self) -> None: ...

    def after_step(self) -> None: ...


def pipeline_topk(d: int, k: int) -> nn.Module | None:
    """`pipeline.models.sae.TopKSAE` with dictionary size d, or None while it does not exist."""
    try:
        from pipeline.models.registry import build

        return build("topk", d=d, dict_size=d, k=k, seed=0)
    except (ImportError, AttributeError):
        return None


def step_fn(model: nn.Module, x: Tensor) -> Callable[[], None]:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    generator = torch.Generator(device=x.device).manual_seed(0)
    if hasattr(model, "fit_init"):
        model.fit_init(x)
    model.train()

    def step() -> None:
        loss, _ = model.training_loss(x, 1.0, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        model.before_step()
        optimizer.step()
        model.after_step()

    return step


def map_fn(model: Cedar, x: Tensor) -> Callable[[], None]:
    """Forward + backward of the orthogonal map A -> U alone, with the step's own gradient dL/dU
    as the upstream gradient (expm's backward cost grows with the norm of what it is given)."""
    parametrization = model.options.parametrization
    a = model.A.detach().clone().requires_grad_(True)
    u = ORTHOGONAL_MAPS[parametrization](a).detach().requires_grad_(True)
    model._loss(x, u, model.k)[0].backward()
    upstream = u.grad

    def run() -> None:
        a.grad = None
        ORTHOGONAL_MAPS[parametrization](a).backward(upstream)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--batch", type=int, nargs="+", default=[256, 1024, 4096], help="batch sizes, one table each")
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    for batch in args.batch:
        measure(args.d, batch, args.k, args.repeats, device)


def measure(d: int, batch: int, k: int, repeats: int, device: torch.device) -> None:
    """Time every step on one (batch, d) batch, interleaved; print the table for this batch size."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    x = torch.randn(batch, d, device=device)

    runs: dict[str, Callable[[], None]] = {"plain": step_fn(PlainTopK(d, d, k).to(device), x)}
    sae = pipeline_topk(d, k)
    if sae is not None:
        runs["pipeline"] = step_fn(sae.to(device), x)
    reference = "pipeline" if sae is not None else "plain"
    for p in ORTHOGONAL_MAPS:
        # a trained-looking A (rotation far from I): the cost of expm grows with ||A - A^T||
        model = Cedar(d, d, k, parametrization=p, init="random", init_scale=1.0, random_k="none", curriculum_frac=0.0).to(device)
        runs[f"{p}:map"] = map_fn(model, x)
        runs[p] = step_fn(model, x)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for repeat in range(repeats + 2):
        for name, run in runs.items():
            sync()
            start = time.perf_counter()
            run()
            sync()
            if repeat >= 2:  # two warm-up rounds
                times[name].append(time.perf_counter() - start)
    ms = {name: 1e3 * min(values) for name, values in times.items()}

    print(f"d={d} batch={batch} k={k} device={device} threads={torch.get_num_threads()} (best of {repeats})")
    print(f"  reference = {'pipeline.models.sae.TopKSAE' if reference == 'pipeline' else 'the plain TopK step of this script'}")
    print(f"  {'plain TopK (bench)':<24} {ms['plain']:8.2f} ms/step  {ms['plain'] / ms[reference]:5.2f}x")
    if "pipeline" in ms:
        print(f"  {'pipeline TopKSAE':<24} {ms['pipeline']:8.2f} ms/step  {1.0:5.2f}x")
    for p in ORTHOGONAL_MAPS:
        share = ms[f"{p}:map"] / ms[p]
        print(f"  CEDAR[{p}]{'':<{17 - len(p)}} {ms[p]:8.2f} ms/step  {ms[p] / ms[reference]:5.2f}x   A->U fwd+bwd {ms[p + ':map']:8.2f} ms = {100 * share:3.0f}% of the step")


if __name__ == "__main__":
    main()
