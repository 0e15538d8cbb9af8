"""Stage `planted`: the planted-structure recovery benchmark on synthetic embeddings with a known basis.

For each noise level: embeddings z = Q^T s + b + noise (k-sparse s); CEDAR and the rotation
baselines are fitted with the pipeline's training loop and scored by axis recovery and held-out
FVU against the oracle. Output: store/metrics/planted.json. Reads params: seed, planted, train,
methods (the rotation methods' options).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import replace

from pipeline.config import Params, load_params
from pipeline.paths import Layout
from pipeline.recovery import recovery
from stages._cli import exit_with, parser, run_main

log = logging.getLogger(__name__)


def run(params: Params, layout: Layout) -> list[dict]:
    p = params.planted
    rows = []
    for noise in p.noises:
        for k in p.ks:
            settings = replace(params.train_settings("cedar"), epochs=p.epochs, batch_size=256, val_fraction=0.1)
            options = {m: params.method_options(m) for m in p.methods}
            rows += recovery(p.d, p.n, k, noise, p.methods, settings, options, seed=params.seed)
    out = layout.planted_metrics
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(rows, indent=1))
    os.replace(tmp, out)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    return run_main("planted", lambda: run(load_params(args.params), Layout(args.root)))


if __name__ == "__main__":
    exit_with(main())
