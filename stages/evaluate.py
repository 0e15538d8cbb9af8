"""Stage `evaluate`: metrics of one trained run, its untrained twin and random codes.

Reconstruction (test split): for the trained model and the untrained model of the same method,
size and seed (initial weights, data-dependent init only, same sparsifier): dataset-level FVU
(float64), mean L0 and dead-latent fraction at the run's k; for rotation methods the FVU-vs-K
curve at every `evaluate.ks` from the one trained rotation.
Concepts (`pipeline.evaluation`): MATCHScores (FBMP for each beta and k, one-to-one),
Delta-MATCHScore, TAPAScore and Delta-stay on the intervention pairs, CKNNA, FMS and linear-probe
loss, for trained, untrained and random codes.
Outputs store/eval/<run>/metrics.json (DVC metrics) and fvu_curve.json (DVC plots).
Reads params: seed, evaluate.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from pipeline.config import Params, Run, load_params
from pipeline.dataset import Dataset, open_dataset
from pipeline.evaluation import ConceptData, ConceptSettings, concept_metrics
from pipeline.metrics.reconstruction import ReconstructionAccumulator
from pipeline.models import build
from pipeline.models.base import SparseModel
from pipeline.models.checkpoint import load_model, read_config
from pipeline.paths import Layout
from pipeline.store import Store, open_store, replace_dir
from stages._cli import exit_with, parser, run_main

log = logging.getLogger(__name__)


@torch.no_grad()
def reconstruction(model: SparseModel, store: Store, rows: np.ndarray, batch_size: int, k: int | None = None) -> dict[str, float]:
    """Streaming FVU / L0 / dead fraction of `model` (at k, default its own) over `rows` of `store`."""
    acc = ReconstructionAccumulator(model.d, model.n_latents)
    for xb in store.iter_batches(batch_size, rows=rows):
        codes = model.encode(torch.as_tensor(xb, dtype=torch.float32), k)
        acc.update(xb.astype(np.float64), model.decode(codes).numpy().astype(np.float64), codes.numpy())
    return asdict(acc.result())


def untrained_twin(params: Params, cell: Run, d: int, store: Store, train_rows: np.ndarray) -> SparseModel:
    """Same method, size, k and seed as the trained run, initialised from data but never trained."""
    model = build(cell.method, d, cell.size, cell.k, seed=params.seed, **params.method_options(cell.method))
    rng = np.random.default_rng(params.seed)
    settings = params.train_settings(cell.method)
    init_rows = np.sort(rng.choice(train_rows, size=min(settings.init_samples, len(train_rows)), replace=False))
    model.fit_init(torch.as_tensor(store.take(init_rows), dtype=torch.float32))
    return model.eval()


def concept_data(params: Params, data: Dataset, kind: str, pair_codes: tuple[np.ndarray, np.ndarray], store: Store) -> ConceptData:
    """One kind's matching rows (training split, subsampled), test rows and pairs, with labels restricted
    to that kind's columns (attribute indices local to them)."""
    train_rows, test_rows = data.rows("train", kind), data.rows("test", kind)
    rng = np.random.default_rng(params.seed)
    match_rows = np.sort(rng.choice(train_rows, size=min(params.evaluate.max_match_rows, len(train_rows)), replace=False))
    columns = np.asarray(data.columns(kind))
    first = int(columns[0])
    pairs = data.pairs
    which = pairs.of_kind(kind)
    local = lambda index: np.where(index >= 0, index - first, -1)  # noqa: E731  (dataset column -> kind column)
    attributes = data.attributes[:, columns]
    return ConceptData(
        x_match=store.take(match_rows), y_match=attributes[match_rows],
        x_test=store.take(test_rows), y_test=attributes[test_rows],
        families={f: [c - first for c in cols] for f, cols in data.families(kind).items()} if data.one_hot(kind) else {},
        pairs_before=pair_codes[0][which], pairs_after=pair_codes[1][which],
        pairs_present=pairs.before_attributes[which][:, columns], pairs_added=local(pairs.added[which]), pairs_removed=local(pairs.removed[which]),
    )


def concept_settings(params: Params) -> ConceptSettings:
    e = params.evaluate
    return ConceptSettings(betas=tuple(e.betas), ks=tuple(e.match_ks), tapas_beta=e.tapas_beta, tapas_k=e.tapas_k,
                           cknna_k=e.cknna_k, cknna_max_n=e.cknna_max_n, fms_max_n=e.fms_max_n, seed=params.seed)


def run(params: Params, layout: Layout, cell: Run) -> dict[str, Any]:
    data = open_dataset(layout.data)
    store = open_store(layout.embeddings / "images.zarr")
    model_dir = layout.models / cell.name
    config = read_config(model_dir)
    model = load_model(model_dir)
    test_rows = data.rows("test")
    bs = params.evaluate.batch_size
    twin = untrained_twin(params, cell, model.d, store, data.rows("train"))
    trained = reconstruction(model, store, test_rows, bs)
    untrained = reconstruction(twin, store, test_rows, bs)
    curve: list[dict[str, Any]] = []
    if cell.rotation:
        for k in sorted({*params.evaluate.ks, cell.k}):
            if k <= model.d:
                for name, m in (("trained", model), ("untrained", twin)):
                    stats = reconstruction(m, store, test_rows, bs, k=k)
                    curve.append({"run": cell.name, "method": cell.method, "model": name, "k": k, "K": stats["l0"], "fvu": stats["fvu"]})
    else:
        for name, stats in (("trained", trained), ("untrained", untrained)):
            curve.append({"run": cell.name, "method": cell.method, "model": name, "k": cell.k, "K": stats["l0"], "fvu": stats["fvu"]})
    history = json.loads((model_dir / "history.json").read_text())
    pair_codes = (open_store(layout.embeddings / "pairs_before.zarr").read(), open_store(layout.embeddings / "pairs_after.zarr").read())
    concepts = {kind: concept_metrics(model, twin, concept_data(params, data, kind, pair_codes, store), concept_settings(params)) for kind in data.kinds}
    metrics = {
        "run": cell.name, "method": cell.method, "size": config["n_latents"], "k": cell.k, "rotation": cell.rotation,
        "trained": trained, "untrained": untrained, "n_test": int(len(test_rows)),
        "train_seconds": history.get("seconds"), "best_epoch": history.get("best_epoch"),
        "concepts": concepts,
    }
    out = layout.evals / cell.name
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    (tmp / "metrics.json").write_text(json.dumps(metrics, indent=1))
    (tmp / "fvu_curve.json").write_text(json.dumps(curve, indent=1))
    replace_dir(tmp, out)
    log.info("%s: FVU %.4f at L0 %.1f (untrained %.4f)", cell.name, trained["fvu"], trained["l0"], untrained["fvu"])
    for kind, c in concepts.items():
        log.info("%s %s: MATCHScore %.3f (delta %.3f), TAPAScore %s", cell.name, kind, c["trained"]["match_score"], c["delta_match_score"],
                 (c["trained"]["tapas"] or {}).get("score"))
    return metrics


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--method", required=True)
    p.add_argument("--size", type=int, default=None)
    p.add_argument("--k", type=int, required=True)
    args = p.parse_args(argv)

    def body() -> None:
        params = load_params(args.params)
        run(params, Layout(args.root), params.cell(args.method, args.size, args.k))

    return run_main("evaluate", body)


if __name__ == "__main__":
    exit_with(main())
