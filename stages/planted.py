"""Stage `planted`: the planted-structure recovery benchmark on synthetic embeddings with a known basis.

For each noise level and k: embeddings z = Q^T s + b + noise (k-sparse s); every method of `planted.methods` (CEDAR,
the rotation baselines, the SAEs) is fitted with the pipeline's training path and its own `train` settings and scored
by axis recovery and held-out FVU against the oracle (`pipeline.scoring.planted`). Output: store/metrics/planted.json
(one row per method and cell: its FVU, the oracle's and their ratio `fvu_ratio`, each naming the device it was
trained on). Reads params: seed, planted, train, methods.
"""

from __future__ import annotations

from typing import Any

from pipeline.config import Params, load_params
from pipeline.paths import Layout
from pipeline.records import write_json
from pipeline.scoring.planted import benchmark
from pipeline.training.device import device_name
from stages.runner import exit_with, parser, run_main


def run(params: Params, layout: Layout) -> list[dict[str, Any]]:
    options = {m: params.method_options(m) for m in params.planted.methods}
    train = {m: params.train_candidates(m) for m in params.planted.methods}
    device = device_name(params.train_settings(params.planted.methods[0]).device)
    rows = [{**row, "device": device} for row in benchmark(params.planted, train, options, params.seed)]
    write_json(layout.planted_metrics, rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    return run_main("planted", lambda: run(load_params(args.params), Layout(args.root)))


if __name__ == "__main__":
    exit_with(main())
