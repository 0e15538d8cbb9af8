"""Stage `cell`: one grid cell (method x dictionary size x k), trained and then evaluated in one process.

DVC runs it once per cell of the `sweep:` grid (stages `rotation@<method>-<k>` and
`sae@<method>-<size>-<k>`); `stages.train` writes store/models/<run>/, `stages.evaluate` writes
store/eval/<run>/ (metrics.json, fvu_curve.json, explain.json).

Why one stage and not a train stage and an evaluate stage per cell: on the default grid a cell's own
work takes a few seconds, less than the fixed cost of a stage, which is a fresh interpreter importing
torch, scikit-learn and torch's compiler (the optimisers import it), about 4 s, plus DVC's
bookkeeping, which re-reads and rewrites the whole dvc.lock after every stage and so grows with the
number of stages. With two stages per cell the default 3 x 3 grid (69 cells) took 19 minutes on two
cores; see the README for the time with one.

Re-evaluating does not retrain: store/models/<run>/ is a persistent DVC output (not deleted before the
stage reruns) and training is skipped when the checkpoint there was trained from the same inputs
(`stages.train.training_fingerprint`: method options, loop settings, seed, embeddings, split rows and
the training code). So a change to `evaluate` or `explain` params reruns every cell's evaluation and
no training; a change to `train` or `methods.<m>` retrains the affected cells.
Reads params: seed, train, methods.<method>, evaluate, explain.
"""

from __future__ import annotations

from pipeline.config import Params
from pipeline.grid import Cell
from pipeline.paths import Layout
from stages import evaluate, train
from stages._cli import cell_main, exit_with


def run(params: Params, layout: Layout, cell: Cell) -> dict:
    """Train (or reuse) the cell's model, then evaluate it; returns the metrics written to metrics.json."""
    train.run(params, layout, cell)
    return evaluate.run(params, layout, cell)


def main(argv: list[str] | None = None) -> int:
    return cell_main("cell", __doc__.splitlines()[0], run, argv)


if __name__ == "__main__":
    exit_with(main())
