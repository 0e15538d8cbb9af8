"""Stage `probes`: fit the linear probes of every kind once per dataset, for every cell's evaluation.

A kind's probes (one multinomial logistic head per one-hot attribute family, `pipeline.metrics.probe`) are fitted on
the dense embeddings of its matching rows (the training split, subsampled to `evaluate.max_match_rows`, then to
`evaluate.probe_max_n`), on the metrics device of `evaluate.device`. They read no sparse model, so this stage fits
them once and every grid cell scores its reconstructions with the same probes (`pipeline.scoring.cell_evaluation`
checks that they were fitted on the rows and settings it reads). Output store/probes/ (`pipeline.scoring.probe_files`),
written to a sibling and renamed into place. Reads params: seed, evaluate.max_match_rows, evaluate.probe_max_n,
evaluate.device.
"""

from __future__ import annotations

import logging

from pipeline.atomic import atomic_dir
from pipeline.config import Params, load_params
from pipeline.data.dataset import open_dataset, open_embeddings
from pipeline.paths import Layout
from pipeline.scoring.cell_evaluation import fit_kind_probes
from pipeline.scoring.probe_files import FittedProbes, save_probes
from stages.runner import exit_with, parser, run_main

log = logging.getLogger(__name__)


def run(params: Params, layout: Layout) -> FittedProbes:
    data = open_dataset(layout.data)
    store = open_embeddings(data, layout.image_embeddings)
    fitted = fit_kind_probes(data, store, params.evaluate, params.seed)
    with atomic_dir(layout.probes) as tmp:
        save_probes(tmp, fitted)
    for kind, probes in fitted.probes.items():
        if probes is None:
            log.info("probes %s: no one-hot attribute family, no probe", kind)
        else:
            log.info("probes %s: %d families, %d L-BFGS iterations", kind, probes.n_families, probes.iterations)
    return fitted


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    return run_main("probes", lambda: run(load_params(args.params), Layout(args.root)))


if __name__ == "__main__":
    exit_with(main())
