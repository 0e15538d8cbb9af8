"""Stage `cell`: one grid cell (method x dictionary size x k), trained and then evaluated in one process.

DVC runs it once per cell of the `sweep:` grid (stages `rotation@<method>-<k>` and
`sae@<method>-<size>-<k>`); `pipeline.training.cell_training.train_cell` writes store/models/<run>/,
`stages.evaluate` writes store/eval/<run>/ (metrics.json, fvu_curve.json, explain.json).

Why one stage and not a train stage and an evaluate stage per cell: on the default grid (30 cells) a cell's own
work takes 12-30 s on two cores, not much more than the fixed cost of a stage, which is a fresh interpreter
importing torch and scikit-learn, a few seconds, plus DVC's bookkeeping, which re-reads and rewrites the whole
dvc.lock after every stage and so grows with the number of stages (measured on an earlier grid of 69 cells: two
stages per cell took 19 minutes on two cores against about half that with one); see the README for today's times.

Re-evaluating does not retrain: store/models/<run>/ is a persistent DVC output (not deleted before the
stage reruns) and training is skipped when the checkpoint there was trained from the same inputs
(`pipeline.training.cell_training.training_fingerprint`: method options, loop settings, seed, embeddings, split rows and
the training code). So a change to `evaluate` or `explain` params reruns every cell's evaluation and
no training; a change to `train` or `methods.<m>` retrains the affected cells.
Reads params: seed, train, methods.<method>, evaluate, explain; and the probes stage's store/probes/.
"""

from __future__ import annotations

from pipeline.config import Params
from pipeline.grid import Cell
from pipeline.paths import Layout
from pipeline.training.cell_training import train_cell
from stages import evaluate
from stages.runner import cell_main, exit_with


def run(params: Params, layout: Layout, cell: Cell) -> dict:
    """Train (or reuse) the cell's model, then evaluate it; returns the metrics written to metrics.json. A missing
    input of the evaluation stops it before training."""
    evaluate.require_inputs(layout)
    train_cell(params, layout, cell)
    return evaluate.run(params, layout, cell)


def main(argv: list[str] | None = None) -> int:
    return cell_main("cell", __doc__.splitlines()[0], run, argv)


if __name__ == "__main__":
    exit_with(main())
