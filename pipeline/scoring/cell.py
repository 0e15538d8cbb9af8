"""Evaluating one grid cell: the trained run against its untrained twin and random codes, and its explanations.

Reconstruction (test split, streamed from the embeddings store): dataset-level FVU (float64), mean L0 and
dead-latent fraction at the run's k, for the trained model and the untrained model of the same method, size and
seed (initial weights, data-dependent init only, same sparsifier); for rotation methods the FVU-vs-K curve at
every `evaluate.ks` from the one trained rotation.
Concepts, per kind of scene (`pipeline.scoring.concepts`): MATCHScores (FBMP for each beta and k, one-to-one),
Delta-MATCHScore, TAPAScore and Delta-stay on the intervention pairs, CKNNA, FMS and linear-probe loss, for
trained, untrained and random codes.
Explanations (`pipeline.explain.run`): latent names, relevance of named concepts, captions from the dense
embedding / the sparse reconstruction / top-k in the original basis, example images and the latents that switch
across intervention pairs.

Takes opened inputs (`CellInputs`) and returns JSON-able records; the evaluate stage reads and writes the files.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pipeline.data.dataset import Dataset, edit_text, sample_rows
from pipeline.explain.decoder import CaptionDecoder
from pipeline.explain.run import Concepts, ExplainSettings, KindData, explain_rows, explain_run
from pipeline.grid import Cell
from pipeline.models import build
from pipeline.models.base import SparseModel
from pipeline.scoring.concepts import ConceptData, EvaluateSettings, concept_metrics
from pipeline.scoring.reconstruction import fvu_curve, reconstruction
from pipeline.store import Store

log = logging.getLogger(__name__)


@dataclass
class CellInputs:
    """What evaluating a cell reads: the dataset, its image embeddings, the pair embeddings (before, after) (p, d),
    the caption decoder and the concept vocabulary (None when the encoder has no text tower)."""

    data: Dataset
    embeddings: Store
    pairs_before: np.ndarray
    pairs_after: np.ndarray
    decoder: CaptionDecoder
    concepts: Concepts | None


@dataclass
class CellEvaluation:
    """The records the evaluate stage writes: metrics.json, fvu_curve.json and explain.json."""

    metrics: dict[str, Any]
    curve: list[dict[str, Any]]
    explanations: dict[str, Any]


def untrained_twin(cell: Cell, d: int, options: dict[str, Any], embeddings: Store, train_rows: np.ndarray, init_samples: int,
                   seed: int) -> SparseModel:
    """Same method, size, k, options and seed as the trained run, initialised from the same data sample, never trained."""
    model = build(cell.method, d, cell.size, cell.k, seed=seed, **options)
    model.fit_init(torch.as_tensor(embeddings.take(sample_rows(train_rows, init_samples, seed)), dtype=torch.float32))
    return model.eval()


def concept_data(inputs: CellInputs, kind: str, max_match_rows: int, seed: int) -> ConceptData:
    """One kind's matching rows (training split, subsampled), test rows and pairs, with labels restricted to that
    kind's columns (attribute indices local to them)."""
    data, store, pairs = inputs.data, inputs.embeddings, inputs.data.pairs
    match_rows = sample_rows(data.rows("train", kind), max_match_rows, seed)
    test_rows = data.rows("test", kind)
    columns = np.asarray(data.columns(kind))
    first = int(columns[0])
    which = pairs.of_kind(kind)
    attributes = data.attributes[:, columns]

    def local(index: np.ndarray) -> np.ndarray:  # dataset column -> kind column (-1 stays -1)
        return np.where(index >= 0, index - first, -1)

    return ConceptData(
        x_match=store.take(match_rows), y_match=attributes[match_rows],
        x_test=store.take(test_rows), y_test=attributes[test_rows],
        families={f: [c - first for c in cols] for f, cols in data.families(kind).items()} if data.one_hot(kind) else {},
        pairs_before=inputs.pairs_before[which], pairs_after=inputs.pairs_after[which],
        pairs_present=pairs.before_attributes[which][:, columns], pairs_added=local(pairs.added[which]), pairs_removed=local(pairs.removed[which]),
    )


def explain_kinds(inputs: CellInputs, explain: ExplainSettings, seed: int) -> list[KindData]:
    """Each kind's test images (the seeded subsample `explain_rows`: the same rows for every run) and its first
    `explain.pairs` intervention pairs, with labels restricted to the kind's columns. Captions of a kind with
    complete labels (one-hot families) are judged against every column of the dataset (the other kinds' attributes
    are false on its rows); those of a multi-label kind against its own columns."""
    data, store, pairs, names, phrases = inputs.data, inputs.embeddings, inputs.data.pairs, inputs.data.attribute_names, inputs.data.phrases
    kinds = []
    for kind in data.kinds:
        test = data.rows("test", kind)
        if len(test) == 0:
            continue
        rows = test[explain_rows(len(test), explain.max_rows, seed)]
        columns = np.asarray(data.columns(kind))
        first = int(columns[0])
        which = pairs.of_kind(kind)[: explain.pairs]
        kinds.append(KindData(
            kind=kind, rows=rows, x=store.take(rows), attributes=data.attributes[rows][:, columns],
            attribute_names=[names[c] for c in columns], families={f: [c - first for c in cols] for f, cols in data.families(kind).items()},
            phrases=[phrases[c] for c in columns], truth=[data.captions[i] for i in rows], scored=data.one_hot(kind),
            pair_ids=which, pairs_before=inputs.pairs_before[which], pairs_after=inputs.pairs_after[which],
            pair_edits=[edit_text(names, int(pairs.removed[i]), int(pairs.added[i])) for i in which],
            **({"caption_attributes": data.attributes[rows], "caption_names": list(names), "caption_phrases": list(phrases)} if data.one_hot(kind) else {}),
        ))
    return kinds


def evaluate_cell(cell: Cell, model: SparseModel, twin: SparseModel, inputs: CellInputs, evaluate: EvaluateSettings, explain: ExplainSettings,
                  seed: int, best_epoch: int | None = None) -> CellEvaluation:
    """Every metric and explanation of one trained run (see the module docstring)."""
    test_rows = inputs.data.rows("test")
    bs = evaluate.batch_size
    trained = reconstruction(model, inputs.embeddings, test_rows, bs)
    untrained = reconstruction(twin, inputs.embeddings, test_rows, bs)
    if cell.rotation:
        points = fvu_curve({"trained": model, "untrained": twin}, inputs.embeddings, test_rows, bs, sorted({*evaluate.ks, cell.k}))
    else:
        points = [{"model": name, "k": cell.k, "K": stats["l0"], "fvu": stats["fvu"]} for name, stats in (("trained", trained), ("untrained", untrained))]
    curve = [{"run": cell.name, "method": cell.method, **point} for point in points]
    concepts = {kind: concept_metrics(model, twin, concept_data(inputs, kind, evaluate.max_match_rows, seed), evaluate, seed)
                for kind in inputs.data.kinds}
    metrics = {
        "run": cell.name, "method": cell.method, "size": model.n_latents, "k": cell.k, "rotation": cell.rotation,
        "trained": trained, "untrained": untrained, "n_test": int(len(test_rows)), "best_epoch": best_epoch,
        "concepts": concepts,
    }
    start = time.perf_counter()
    # the decoder's input mean is the mean training embedding: the captions stage trains it on exactly the training split
    image_mean = inputs.decoder.input_mean.detach().cpu().numpy()
    explained = explain_run(model, cell.k, inputs.decoder, explain_kinds(inputs, explain, seed), inputs.concepts, image_mean, explain)
    log.info("%s: explanations in %.1f s", cell.name, time.perf_counter() - start)
    return CellEvaluation(metrics, curve, {"run": cell.name, "method": cell.method, **explained})
