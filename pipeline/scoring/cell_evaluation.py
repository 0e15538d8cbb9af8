"""Evaluating one grid cell: the trained run against its untrained twin and random codes, and its explanations.

Reconstruction (test split, streamed from the embeddings store): dataset-level FVU (float64), mean L0 and
dead-latent fraction at the run's k, for the trained model and the untrained model of the same method, size and
seed (initial weights, data-dependent init only, same sparsifier); for rotation methods the FVU-vs-K curve at
every `evaluate.ks` from the one trained rotation.
Concepts, per kind of scene (`pipeline.scoring.concepts`): MATCHScores (FBMP for each beta and k, one-to-one),
Delta-MATCHScore, TAPAScore and Delta-stay on the intervention pairs, CKNNA, FMS and linear-probe loss, for
trained, untrained and random codes.
Explanations (`pipeline.explain.explanations`): latent names, relevance of named concepts, captions from the dense
embedding / the sparse reconstruction / top-k in the original basis, example images and the latents that switch
across intervention pairs.

Streaming: each model is run once over each row set it is scored on (the test split, the matching rows of every
kind, both sides of the pairs), batch by batch on `evaluate.device`; that pass gives the reconstruction statistics
and the probe scores and writes the sparse codes to a code set (`pipeline.scoring.codes`) in the run's codes folder
(`Layout.codes`, beside the model). The concept metrics and the explanations read the rows they need from there. A
code set whose fingerprint (the model's weights, the rows, the source store, the probes) is unchanged is reused
without encoding, so re-evaluating a cell with new evaluate or explain params encodes nothing.

Takes opened inputs (`CellInputs`) and returns JSON-able records; the evaluate stage reads and writes the files.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.data.dataset import Dataset, edit_text, sample_rows
from pipeline.encoders.base import weights_digest
from pipeline.explain.decoder import CaptionDecoder
from pipeline.explain.explanations import Concepts, KindData, explain_rows, explain_run
from pipeline.explain.options import ExplainSettings
from pipeline.grid import Cell
from pipeline.metrics.probe import SOLVER as PROBE_SOLVER
from pipeline.models.base import SparseModel
from pipeline.models.registry import build
from pipeline.provenance import rows_digest
from pipeline.scoring.codes import CodeSet, CodesWriter, open_codes
from pipeline.scoring.concepts import ConceptData, ProbeStream, VariantCodes, concept_metrics, fit_family_probes, metrics_device
from pipeline.scoring.encoding_pass import OnBatch, encode_rows, fvu_curve
from pipeline.scoring.options import EvaluateSettings
from pipeline.scoring.timings import Timings
from pipeline.store import Store, StoreError
from pipeline.training.device import device_name, resolve_device

log = logging.getLogger(__name__)

#: the row sets every model is encoded on, in the order they are written
CODE_SETS = ("test", "match", "pairs_before", "pairs_after")


@dataclass
class CellInputs:
    """What evaluating a cell reads: the dataset, its image embeddings (n, d), the pair embeddings (before, after)
    (p, d), the caption decoder and the concept vocabulary (None when the encoder has no text tower)."""

    data: Dataset
    embeddings: Store
    pairs_before: Store
    pairs_after: Store
    decoder: CaptionDecoder
    concepts: Concepts | None


@dataclass
class CellEvaluation:
    """The records the evaluate stage writes: metrics.json, fvu_curve.json and explain.json, and the seconds of each
    part of the evaluation (`pipeline.scoring.timings`; a separate file: wall-clock numbers differ from run to run)."""

    metrics: dict[str, Any]
    curve: list[dict[str, Any]]
    explanations: dict[str, Any]
    timings: dict[str, float]


def untrained_twin(cell: Cell, d: int, options: dict[str, Any], embeddings: Store, train_rows: np.ndarray, init_samples: int,
                   seed: int) -> SparseModel:
    """Same method, size, k, options and seed as the trained run, initialised from the same data sample, never trained."""
    model = build(cell.method, d, cell.size, cell.k, seed=seed, **options)
    model.fit_init(torch.as_tensor(embeddings.take(sample_rows(train_rows, init_samples, seed)), dtype=torch.float32))
    return model.eval()


def concept_data(inputs: CellInputs, kind: str, settings: EvaluateSettings, seed: int) -> ConceptData:
    """One kind's row ids and readers: matching rows (training split, subsampled to `max_match_rows`), every test row,
    the FMS/CKNNA pool (`max_test_rows`) and the pairs, with labels restricted to the kind's columns (attribute
    indices local to them)."""
    data, store, pairs = inputs.data, inputs.embeddings, inputs.data.pairs
    test_rows = data.rows("test", kind)
    columns = np.asarray(data.columns(kind))
    first = int(columns[0])
    which = pairs.of_kind(kind)

    def local(index: np.ndarray) -> np.ndarray:  # dataset column -> kind column (-1 stays -1)
        return np.where(index >= 0, index - first, -1)

    return ConceptData(
        match_rows=sample_rows(data.rows("train", kind), settings.max_match_rows, seed), test_rows=test_rows,
        pool_rows=sample_rows(test_rows, settings.max_test_rows, seed),
        labels=lambda rows: data.labels(rows)[:, columns], embeddings=store.take,
        families={f: [c - first for c in cols] for f, cols in data.families(kind).items()} if data.one_hot(kind) else {},
        pair_ids=which, pairs_present=pairs.before_attributes[which][:, columns], pairs_added=local(pairs.added[which]),
        pairs_removed=local(pairs.removed[which]), pairs_family=np.asarray(pairs.family, dtype=str)[which],
    )


def encoded(model: SparseModel, store: Store, rows: np.ndarray, batch_size: int, path: Path, fingerprint: dict[str, Any],
            on_batch: OnBatch | None = None, extra: dict[str, Any] | None = None) -> CodeSet:
    """The code set of `model` on `rows` of `store` at `path`: reused when its fingerprint matches, else one
    streamed pass (`encode_rows`) writes it, its reconstruction statistics and `extra()` results in its meta."""
    try:
        existing = open_codes(path)
        if existing.meta.get("fingerprint") == json.loads(json.dumps(fingerprint)):
            log.info("%s: codes unchanged, reused", path)
            return existing
    except (StoreError, ValueError, OSError):
        pass
    writer = CodesWriter(path, model.n_half_latents, fingerprint)
    stats = encode_rows(model, store, rows, batch_size, codes=writer, on_batch=on_batch) if len(rows) else {}
    return writer.finalize({**stats, **(extra() if extra else {})})


def encode_model(name: str, model: SparseModel, inputs: CellInputs, kinds: dict[str, ConceptData], probes: dict[str, Any],
                 settings: EvaluateSettings, seed: int, codes_dir: Path, timings: Timings | None = None) -> dict[str, CodeSet]:
    """Every code set of one model (`CODE_SETS`); the test pass also streams the probes of every kind (their scores
    land in the test set's meta under "probe"; their seconds in `timings`' "probes")."""
    base = {"model": weights_digest(model), "method": model.method, "k": model.k}
    match_rows = np.unique(np.concatenate([d.match_rows for d in kinds.values()]))
    pair_ids = np.arange(len(inputs.data.pairs))
    streams = {kind: ProbeStream(probes[kind], d, timings) for kind, d in kinds.items()}

    def on_batch(rows: np.ndarray, x: np.ndarray, x_hat: np.ndarray) -> None:
        for stream in streams.values():
            stream.add(rows, x, x_hat)

    def source(store: Store, rows: np.ndarray) -> dict[str, Any]:
        return {**base, "store": store.attrs.get("fingerprint"), "rows": rows_digest(rows)}

    probe_key = {kind: {"rows": rows_digest(d.match_rows), "families": d.families, "seed": seed, "solver": PROBE_SOLVER} for kind, d in kinds.items()}
    test_rows = inputs.data.rows("test")
    bs = settings.batch_size
    return {
        "test": encoded(model, inputs.embeddings, test_rows, bs, codes_dir / name / "test", {**source(inputs.embeddings, test_rows), "probes": probe_key},
                        on_batch, lambda: {"probe": {kind: stream.result() for kind, stream in streams.items()}}),
        "match": encoded(model, inputs.embeddings, match_rows, bs, codes_dir / name / "match", source(inputs.embeddings, match_rows)),
        "pairs_before": encoded(model, inputs.pairs_before, pair_ids, bs, codes_dir / name / "pairs_before", source(inputs.pairs_before, pair_ids)),
        "pairs_after": encoded(model, inputs.pairs_after, pair_ids, bs, codes_dir / name / "pairs_after", source(inputs.pairs_after, pair_ids)),
    }


def reconstruction_stats(test: CodeSet) -> dict[str, float]:
    """FVU, L0, dead fraction and n of the test pass (kept in the test code set's meta)."""
    return {key: test.stats[key] for key in ("fvu", "l0", "dead_fraction", "n")}


def explain_kinds(inputs: CellInputs, codes: CodeSet, explain: ExplainSettings, seed: int) -> list[KindData]:
    """Each kind's test images (the seeded subsample `explain_rows`: the same rows for every run) with their codes
    (read from the trained model's test code set) and its first `explain.pairs` intervention pairs, with labels
    restricted to the kind's columns. Captions of a kind with complete labels (one-hot families) are judged against
    every column of the dataset (the other kinds' attributes are false on its rows); those of a multi-label kind
    against its own columns."""
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
        labels = data.labels(rows)
        kinds.append(KindData(
            kind=kind, rows=rows, x=store.take(rows), attributes=labels[:, columns], codes=codes.codes(rows),
            attribute_names=[names[c] for c in columns], families={f: [c - first for c in cols] for f, cols in data.families(kind).items()},
            phrases=[phrases[c] for c in columns], truth=data.caption_rows(rows), scored=data.one_hot(kind),
            pair_ids=which, pairs_before=inputs.pairs_before.take(which).astype(np.float32), pairs_after=inputs.pairs_after.take(which).astype(np.float32),
            pair_edits=[edit_text(names, int(pairs.removed[i]), int(pairs.added[i])) for i in which],
            **({"caption_attributes": labels, "caption_names": list(names), "caption_phrases": list(phrases)} if data.one_hot(kind) else {}),
        ))
    return kinds


def evaluate_cell(cell: Cell, model: SparseModel, twin: SparseModel, inputs: CellInputs, evaluate: EvaluateSettings, explain: ExplainSettings,
                  seed: int, codes_dir: Path, best_epoch: int | None = None) -> CellEvaluation:
    """Every metric and explanation of one trained run (see the module docstring); codes go to `codes_dir`."""
    started, timings = time.perf_counter(), Timings()
    device = resolve_device(evaluate.device)
    model, twin = model.to(device).eval(), twin.to(device).eval()
    test_rows = inputs.data.rows("test")
    kinds = {kind: concept_data(inputs, kind, evaluate, seed) for kind in inputs.data.kinds}
    with timings.part("probes"):
        probes = {kind: fit_family_probes(d, seed, evaluate.probe_max_n, metrics_device(evaluate.device)) for kind, d in kinds.items()}
    start = time.perf_counter()
    with timings.part("encode"):
        codes = {name: encode_model(name, m, inputs, kinds, probes, evaluate, seed, codes_dir, timings) for name, m in (("trained", model), ("untrained", twin))}
    log.info("%s: codes of %d test, %d matching rows and %d pairs in %.1f s", cell.name, len(test_rows), len(codes["trained"]["match"]),
             len(inputs.data.pairs), time.perf_counter() - start)
    trained, untrained = reconstruction_stats(codes["trained"]["test"]), reconstruction_stats(codes["untrained"]["test"])
    if cell.rotation:
        with timings.part("fvu"):
            points = fvu_curve({"trained": model, "untrained": twin}, inputs.embeddings, test_rows, evaluate.batch_size, sorted({*evaluate.ks, cell.k}))
    else:
        points = [{"model": name, "k": cell.k, "K": stats["l0"], "fvu": stats["fvu"]} for name, stats in (("trained", trained), ("untrained", untrained))]
    curve = [{"run": cell.name, "method": cell.method, **point} for point in points]

    def variant(name: str, kind: str) -> VariantCodes:
        sets = codes[name]
        return VariantCodes(sets["match"], sets["test"], sets["pairs_before"], sets["pairs_after"], sets["test"].stats["probe"][kind])

    concepts = {kind: concept_metrics(variant("trained", kind), variant("untrained", kind), d, evaluate, seed, timings) for kind, d in kinds.items()}
    metrics = {
        "run": cell.name, "method": cell.method, "size": model.n_latents, "k": cell.k, "rotation": cell.rotation,
        "trained": trained, "untrained": untrained, "n_test": int(len(test_rows)), "best_epoch": best_epoch,
        "device": device_name(device), "concepts": concepts,
    }
    start = time.perf_counter()
    # the decoder's input mean is the mean training embedding: the captions stage trains it on exactly the training split
    image_mean = inputs.decoder.input_mean.detach().cpu().numpy()
    with timings.part("explain"):
        explained = explain_run(model.cpu(), cell.k, inputs.decoder, explain_kinds(inputs, codes["trained"]["test"], explain, seed), inputs.concepts,
                                image_mean, explain)
    log.info("%s: explanations in %.1f s", cell.name, time.perf_counter() - start)
    return CellEvaluation(metrics, curve, {"run": cell.name, "method": cell.method, **explained}, timings.record(time.perf_counter() - started))
