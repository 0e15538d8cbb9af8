"""Evaluation of one grid cell (run by `stages.cell`): reads the trained run and its inputs, writes its records.

The work is `pipeline.scoring.cell_evaluation.evaluate_cell` (the trained run against its untrained twin and random codes:
reconstruction, the FVU-vs-K curve, concept metrics, explanations). Outputs store/eval/<run>/metrics.json (DVC
metrics), fvu_curve.json (DVC plots) and explain.json, written to a sibling folder and renamed into place; the sparse
codes of the evaluation rows go to store/models/<run>.codes/ (reused by a later evaluation of the same model). The
seconds of each part of the evaluation go to store/timings/<run>.json (a DVC metric of its own: wall-clock numbers
differ between runs, so they stay out of the outputs that must be byte for byte reproducible and that the report
reads).
Memory is bounded by the batch and subset sizes of `evaluate` and `explain`, not by the number of embeddings
(docs/architecture.md, "Memory at scale").
Reads params: seed, train (the twin's init sample), methods.<method>, evaluate, explain.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pipeline.atomic import atomic_dir
from pipeline.config import Params
from pipeline.data.dataset import open_dataset
from pipeline.explain.decoder import load_decoder
from pipeline.explain.explanations import Concepts
from pipeline.grid import Cell
from pipeline.models.checkpoint import load_model
from pipeline.paths import Layout
from pipeline.records import write_json
from pipeline.scoring.cell_evaluation import CellInputs, evaluate_cell, untrained_twin
from pipeline.store import open_store

log = logging.getLogger(__name__)


def read_concepts(layout: Layout) -> Concepts | None:
    """The concept vocabulary's texts and text embeddings, or None with a warning when the encoder has no text
    tower (extract then writes no concept store): latents stay unnamed."""
    path = layout.concept_embeddings
    if not path.exists():
        log.warning("%s: missing (the encoder has no text tower): latents stay unnamed", path)
        return None
    vocabulary = open_store(path)
    texts = vocabulary.attrs.get("texts")
    if not isinstance(texts, list) or len(texts) != len(vocabulary):
        raise ValueError(f"{path}: expected attrs['texts'] with one text per row ({len(vocabulary)}), got {type(texts).__name__}")
    return Concepts(texts=[str(t) for t in texts], embeddings=vocabulary.read())


def run(params: Params, layout: Layout, cell: Cell) -> dict[str, Any]:
    model = load_model(layout.model(cell.name))
    inputs = CellInputs(  # everything is opened before the long work: a missing input fails fast
        data=open_dataset(layout.data),
        embeddings=open_store(layout.image_embeddings),
        pairs_before=open_store(layout.pair_embeddings("before")),
        pairs_after=open_store(layout.pair_embeddings("after")),
        decoder=load_decoder(layout.captions),
        concepts=read_concepts(layout),
    )
    history = json.loads(layout.model_history(cell.name).read_text())
    twin = untrained_twin(cell, model.d, params.method_options(cell.method), inputs.embeddings, inputs.data.rows("train"),
                          params.train_settings(cell.method).init_samples, params.seed)
    result = evaluate_cell(cell, model, twin, inputs, params.evaluate, params.explain, params.seed, layout.codes(cell.name), history.get("best_epoch"))
    with atomic_dir(layout.evaluation(cell.name)) as tmp:
        write_json(tmp / layout.run_metrics(cell.name).name, result.metrics)
        write_json(tmp / layout.run_curve(cell.name).name, result.curve)
        write_json(tmp / layout.run_explanations(cell.name).name, result.explanations)
    write_json(layout.run_timings(cell.name), result.timings)
    metrics, trained = result.metrics, result.metrics["trained"]
    log.info("%s: FVU %.4f at L0 %.1f (untrained %.4f) on %s", cell.name, trained["fvu"], trained["l0"], metrics["untrained"]["fvu"], metrics["device"])
    for kind, c in metrics["concepts"].items():
        log.info("%s %s: MATCHScore %.3f (delta %.3f), TAPAScore %s", cell.name, kind, c["trained"]["match_score"], c["delta_match_score"],
                 (c["trained"]["tapas"] or {}).get("score"))
    for kind, rates in result.explanations["describes"].items():
        log.info("%s %s: describes the image: dense %.3f, sparse %.3f, top-k original basis %.3f", cell.name, kind,
                 rates["dense"], rates["sparse"], rates["topk_original"])
    return metrics
