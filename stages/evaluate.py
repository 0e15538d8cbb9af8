"""Evaluation of one grid cell (run by `stages.cell`): reads the trained run and its inputs, writes its records.

The work is `pipeline.scoring.cell_evaluation.evaluate_cell` (the trained run against its untrained twin and random codes:
reconstruction, the FVU-vs-K curve, concept metrics, explanations). Outputs store/eval/<run>/metrics.json (DVC
metrics), fvu_curve.json (DVC plots) and explain.json, written to a sibling folder and renamed into place; the sparse
codes of the evaluation rows go to store/models/<run>.codes/ (reused by a later evaluation of the same model). The
seconds of each part of the evaluation go to store/timings/<run>.json (a DVC metric of its own: wall-clock numbers
differ between runs, so they stay out of the outputs that must be byte for byte reproducible and that the report
reads).
The records' JSON (key names and order, which the report and the tests read) is made here from the evaluation's
frozen results (`metrics_record`, `curve_record`, `explain_record`).
Memory is bounded by the batch and subset sizes of `evaluate` and `explain`, not by the number of embeddings
(docs/architecture.md, "Memory at scale").
Reads params: seed, train (the twin's init sample), methods.<method>, evaluate, explain; and the probes stage's
store/probes/ (the linear probes, fitted once per dataset).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from typing import Any

from pipeline.atomic import atomic_dir
from pipeline.config import Params
from pipeline.data.dataset import open_dataset
from pipeline.explain.decoder import load_decoder
from pipeline.explain.explanations import Concepts
from pipeline.grid import Cell
from pipeline.metrics.tapas import Tapas
from pipeline.models.checkpoint import load_model
from pipeline.paths import Layout
from pipeline.records import write_json
from pipeline.scoring.cell_evaluation import CellEvaluation, CellInputs, evaluate_cell, untrained_twin
from pipeline.scoring.concepts import KindMetrics, MatchingScores, TapasScores, VariantMetrics, metrics_device
from pipeline.scoring.probe_files import load_probes
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


def rule_name(beta: float) -> str:
    """The JSON name of FBMP's rule at `beta` ("fbmp_b0.5")."""
    return f"fbmp_b{beta:g}"


def matching_record(scores: MatchingScores) -> dict[str, Any]:
    fbmp = {rule_name(beta): {"match": {k: s.match for k, s in by_k.items()}, "test": {k: s.test for k, s in by_k.items()}}
            for beta, by_k in scores.fbmp.items()}
    return {**fbmp, "one_to_one": {"match": scores.one_to_one.match, "test": scores.one_to_one.test}}


def tapas_record(tapas: Tapas) -> dict[str, Any]:
    return {"score": tapas.score, "delta_add": tapas.delta_add, "delta_rem": tapas.delta_rem, "n_pairs": tapas.n_pairs, "n_add": tapas.n_add,
            "n_rem": tapas.n_rem, "n_scored": tapas.n_scored}


def tapas_scores_record(tapas: TapasScores | None) -> dict[str, Any] | None:
    if tapas is None:
        return None
    return {**tapas_record(tapas.overall), "families": {family: tapas_record(t) for family, t in tapas.families.items()}}


def variant_record(v: VariantMetrics) -> dict[str, Any]:
    return {"matching": matching_record(v.matching), "match_score": v.match_score, "tapas": tapas_scores_record(v.tapas), "delta_stay": v.delta_stay,
            "cknna": v.cknna, "fms": v.fms, "probe": asdict(v.probe) if v.probe is not None else None, "coalitions": [list(c) for c in v.coalitions],
            "match_strongest": v.match_strongest}


def kind_record(m: KindMetrics) -> dict[str, Any]:
    delta = {**{rule_name(beta): dict(by_k) for beta, by_k in m.delta_matching.fbmp.items()}, "one_to_one": m.delta_matching.one_to_one}
    return {"trained": variant_record(m.trained), "untrained": variant_record(m.untrained), "random": variant_record(m.random),
            "delta_match_score": m.delta_match_score, "delta_matching": delta, "delta_match_strongest": m.delta_match_strongest}


def metrics_record(result: CellEvaluation) -> dict[str, Any]:
    """metrics.json's content."""
    cell = result.cell
    return {
        "run": cell.name, "method": cell.method, "size": result.size, "k": cell.k, "rotation": cell.rotation,
        "trained": asdict(result.trained), "untrained": asdict(result.untrained), "n_test": result.n_test, "best_epoch": result.best_epoch,
        "device": result.device, "concepts": {kind: kind_record(m) for kind, m in result.concepts.items()},
    }


def curve_record(result: CellEvaluation) -> list[dict[str, Any]]:
    """fvu_curve.json's content."""
    return [{"run": result.cell.name, "method": result.cell.method, **asdict(point)} for point in result.curve]


def explain_record(result: CellEvaluation) -> dict[str, Any]:
    """explain.json's content."""
    return {"run": result.cell.name, "method": result.cell.method, **result.explanations}


def require_inputs(layout: Layout) -> None:
    """Stop, naming the stage that writes it, when an output of an earlier dataset-level stage the evaluation reads is
    missing (checked by the cell stage before it trains)."""
    for path, stage in ((layout.image_embeddings, "extract"), (layout.captions, "captions"), (layout.probes, "probes")):
        if not path.exists():
            raise FileNotFoundError(f"{path}: missing; the {stage} stage writes it (dvc repro {stage}, or python -m stages.{stage})")


def run(params: Params, layout: Layout, cell: Cell) -> dict[str, Any]:
    """Evaluate the cell and write its records; returns metrics.json's content."""
    model = load_model(layout.model(cell.name))
    inputs = CellInputs(  # everything is opened before the long work: a missing input fails fast
        data=open_dataset(layout.data),
        embeddings=open_store(layout.image_embeddings),
        pairs_before=open_store(layout.pair_embeddings("before")),
        pairs_after=open_store(layout.pair_embeddings("after")),
        decoder=load_decoder(layout.captions),
        concepts=read_concepts(layout),
        probes=load_probes(layout.probes, metrics_device(params.evaluate.device)),
    )
    history = json.loads(layout.model_history(cell.name).read_text())
    twin = untrained_twin(cell, model.d, params.method_options(cell.method), inputs.embeddings, inputs.data.rows("train"),
                          params.train_settings(cell.method).init_samples, params.seed)
    result = evaluate_cell(cell, model, twin, inputs, params.evaluate, params.explain, params.seed, layout.codes(cell.name), history.get("best_epoch"))
    metrics, explanations = metrics_record(result), explain_record(result)
    with atomic_dir(layout.evaluation(cell.name)) as tmp:
        write_json(tmp / layout.run_metrics(cell.name).name, metrics)
        write_json(tmp / layout.run_curve(cell.name).name, curve_record(result))
        write_json(tmp / layout.run_explanations(cell.name).name, explanations)
    write_json(layout.run_timings(cell.name), dict(result.timings))
    log.info("%s: FVU %.4f at L0 %.1f (untrained %.4f) on %s", cell.name, result.trained.fvu, result.trained.l0, result.untrained.fvu, result.device)
    for kind, c in result.concepts.items():
        log.info("%s %s: MATCHScore %.3f (delta %.3f), TAPAScore %s", cell.name, kind, c.trained.match_score, c.delta_match_score,
                 c.trained.tapas.overall.score if c.trained.tapas is not None else None)
    for kind, rates in explanations["describes"].items():
        log.info("%s %s: describes the image: dense %.3f, sparse %.3f, top-k original basis %.3f", cell.name, kind,
                 rates["dense"], rates["sparse"], rates["topk_original"])
    return metrics
