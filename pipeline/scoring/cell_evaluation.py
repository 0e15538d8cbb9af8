"""Evaluating one grid cell: the trained run against its untrained twin and random codes, and its explanations.

Reconstruction (test split, streamed from the embeddings store): dataset-level FVU (float64), mean L0 and
dead-latent fraction at the run's k, for the trained model and the untrained model of the same method, size and
seed (initial weights, data-dependent init only, same sparsifier); for rotation methods the FVU-vs-K curve at
every `evaluate.ks` from the one trained rotation.
Concepts, per kind of scene (`pipeline.scoring.concepts`): MATCHScores (FBMP for each beta and k, one-to-one),
Delta-MATCHScore, TAPAScore and Delta-stay on the intervention pairs, CKNNA, FMS and linear-probe loss, for
trained, untrained and random codes. The linear probes those scores use are fitted once per dataset on dense
embeddings (the probes stage, `fit_kind_probes`; they depend on no model) and come in with the inputs, which checks
that they were fitted on the rows and settings this evaluation reads.
Explanations (`pipeline.explain.explanations`): latent names, relevance of named concepts, captions from the dense
embedding / the sparse reconstruction / top-k in the original basis, example images and the latents that switch
across intervention pairs.

Streaming: each model is run once over each row set it is scored on (the test split, the matching rows of every
kind, both sides of the pairs), batch by batch on `evaluate.device`; that pass gives the reconstruction statistics
and the probe scores and writes the sparse codes to a code set (`pipeline.scoring.codes`) in the run's codes folder
(`Layout.codes`, beside the model). The concept metrics and the explanations read the rows they need from there. A
code set whose fingerprint (the model's weights, the rows, the source store, the probes) is unchanged is reused
without encoding, so re-evaluating a cell with new evaluate or explain params encodes nothing.

Three steps, each returning frozen result objects: the encode pass (`encode_model` -> `EncodedModel`: code sets,
reconstruction statistics, probe scores), the concept metrics (`pipeline.scoring.concepts.concept_metrics` ->
`KindMetrics`) and the explanations (`pipeline.explain.explanations.explain_run`, its explain.json record). A reused
code set's statistics come from its meta.json, parsed into the same objects (`pass_result`). `evaluate_cell` takes
opened inputs (`CellInputs`) and returns a `CellEvaluation`; only the evaluate stage turns it into JSON and writes
the files.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
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
from pipeline.metrics.reconstruction import ReconstructionStats
from pipeline.models.base import SparseModel
from pipeline.models.registry import build
from pipeline.provenance import rows_digest
from pipeline.records import Undefined, jsonable
from pipeline.scoring.codes import CodeSet, CodesWriter, open_codes
from pipeline.scoring.concepts import ConceptData, KindMetrics, ProbeScores, ProbeStream, VariantCodes, concept_metrics, fit_family_probes, metrics_device
from pipeline.scoring.encoding_pass import CurvePoint, encode_rows, fvu_curve
from pipeline.scoring.options import EvaluateSettings
from pipeline.scoring.probe_files import FittedProbes
from pipeline.scoring.timings import Timings
from pipeline.store import Store, StoreError
from pipeline.training.device import device_name, resolve_device

log = logging.getLogger(__name__)

#: the row sets every model is encoded on, in the order they are written
CODE_SETS = ("test", "match", "pairs_before", "pairs_after")


@dataclass
class CellInputs:
    """What evaluating a cell reads: the dataset, its image embeddings (n, d), the pair embeddings (before, after)
    (p, d), the caption decoder, the concept vocabulary (None when the encoder has no text tower) and the linear
    probes of every kind (the probes stage's, `fit_kind_probes`)."""

    data: Dataset
    embeddings: Store
    pairs_before: Store
    pairs_after: Store
    decoder: CaptionDecoder
    concepts: Concepts | None
    probes: FittedProbes


@dataclass(frozen=True)
class EncodedModel:
    """The encode pass of one model: its code sets (`CODE_SETS`), the reconstruction statistics of the test pass
    and, per kind, its probe scores on the kind's test rows (None where the kind has no probe)."""

    test: CodeSet
    match: CodeSet
    pairs_before: CodeSet
    pairs_after: CodeSet
    reconstruction: ReconstructionStats
    probes: Mapping[str, ProbeScores | None]

    def variant(self, kind: str) -> VariantCodes:
        """The codes and probe scores the concept metrics of `kind` read."""
        return VariantCodes(self.match, self.test, self.pairs_before, self.pairs_after, self.probes[kind])


@dataclass(frozen=True)
class CellEvaluation:
    """Everything the evaluate stage writes: metrics.json (the cell, the latent count `size`, the trained and
    untrained reconstruction statistics on the `n_test` test rows, `best_epoch`, the encoding `device`, the concept
    metrics per kind), fvu_curve.json (`curve`), explain.json (`explanations`: `explain_run`'s record) and the seconds
    of each part (`pipeline.scoring.timings`; a file of its own: wall-clock numbers differ from run to run)."""

    cell: Cell
    size: int
    n_test: int
    best_epoch: int | None
    device: str
    trained: ReconstructionStats
    untrained: ReconstructionStats
    concepts: Mapping[str, KindMetrics]
    curve: tuple[CurvePoint, ...]
    explanations: Mapping[str, Any]
    timings: Mapping[str, float]


def untrained_twin(cell: Cell, d: int, options: dict[str, Any], embeddings: Store, train_rows: np.ndarray, init_samples: int,
                   seed: int) -> SparseModel:
    """Same method, size, k, options and seed as the trained run, initialised from the same data sample, never trained."""
    model = build(cell.method, d, cell.size, cell.k, seed=seed, **options)
    model.fit_init(torch.as_tensor(embeddings.take(sample_rows(train_rows, init_samples, seed)), dtype=torch.float32))
    return model.eval()


def concept_data(data: Dataset, store: Store, kind: str, settings: EvaluateSettings, seed: int) -> ConceptData:
    """One kind's row ids and readers (embeddings from `store`): matching rows (training split, subsampled to
    `max_match_rows`), every test row, the FMS/CKNNA pool (`max_test_rows`) and the pairs, with labels restricted to
    the kind's columns (attribute indices local to them)."""
    pairs = data.pairs
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


def probe_fingerprint(kinds: Mapping[str, ConceptData], store: Store, settings: EvaluateSettings, seed: int) -> dict[str, Any]:
    """What the probes of each kind are fitted on (JSON-ready): its matching rows, families, the seed and row cap of the
    fit's subsample, the solver and the source store."""
    return jsonable({kind: {"rows": rows_digest(d.match_rows), "families": d.families, "seed": seed, "max_n": settings.probe_max_n,
                            "solver": PROBE_SOLVER, "store": store.attrs.get("fingerprint")} for kind, d in kinds.items()})


def fit_kind_probes(data: Dataset, store: Store, settings: EvaluateSettings, seed: int) -> FittedProbes:
    """The linear probes of every kind (`fit_family_probes` on its matching rows' dense embeddings, on the metrics
    device of `settings.device`): model-independent, fitted once per dataset by the probes stage."""
    kinds = {kind: concept_data(data, store, kind, settings, seed) for kind in data.kinds}
    probes = {kind: fit_family_probes(d, seed, settings.probe_max_n, metrics_device(settings.device)) for kind, d in kinds.items()}
    return FittedProbes(probes=probes, fingerprint=probe_fingerprint(kinds, store, settings, seed))


def pass_stats(reconstruction: ReconstructionStats | None, probes: Mapping[str, ProbeScores | None] | None) -> dict[str, Any]:
    """What a code set's meta.json keeps of its pass ("stats"): the reconstruction statistics and, for the test set,
    the probe scores per kind under "probe"."""
    stats: dict[str, Any] = asdict(reconstruction) if reconstruction is not None else {}
    if probes is not None:
        stats["probe"] = {kind: asdict(scores) if scores is not None else None for kind, scores in probes.items()}
    return stats


def _number(record: Mapping[str, Any], key: str, where: str) -> float:
    """record[key] as a float; a NaN written as null comes back `Undefined` with the reason written beside it."""
    if key not in record:
        raise ValueError(f"{where}: no {key!r} in its statistics (meta.json); delete the code set to encode it again")
    value = record[key]
    return Undefined(record.get(f"{key}_undefined", "not a number")) if value is None else float(value)


def pass_result(codes: CodeSet, kinds: Iterable[str]) -> tuple[ReconstructionStats, dict[str, ProbeScores | None]]:
    """The reconstruction statistics and the probe scores of `kinds` kept in a test code set's meta.json
    (`pass_stats`), parsed: the one way they come back, whether the set was just written or reused."""
    stats, where = codes.stats, str(codes.path)
    reconstruction = ReconstructionStats(*(_number(stats, key, where) for key in ("fvu", "l0", "dead_fraction")), n=int(_number(stats, "n", where)))
    probes = stats.get("probe")
    if not isinstance(probes, dict):
        raise ValueError(f"{where}: no probe scores in its statistics (meta.json); delete the code set to encode it again")
    out: dict[str, ProbeScores | None] = {}
    for kind in kinds:
        if kind not in probes:
            raise ValueError(f"{where}: no probe scores of kind {kind!r} in its statistics (meta.json); delete the code set to encode it again")
        record = probes[kind]
        out[kind] = None if record is None else ProbeScores(*(_number(record, f.name, f"{where} (probe {kind})") for f in fields(ProbeScores)))
    return reconstruction, out


def encoded(model: SparseModel, store: Store, rows: np.ndarray, batch_size: int, path: Path, fingerprint: dict[str, Any],
            probes: Mapping[str, ProbeStream] | None = None) -> CodeSet:
    """The code set of `model` on `rows` of `store` at `path`: reused when its fingerprint matches, else one
    streamed pass (`encode_rows`) writes it; with `probes` (per kind: the test set) the pass also decodes, and its
    reconstruction statistics and the probes' scores on its batches go to its meta (`pass_stats`)."""
    try:
        existing = open_codes(path)
        if existing.meta.get("fingerprint") == json.loads(json.dumps(fingerprint)):
            log.info("%s: codes unchanged, reused", path)
            return existing
    except (StoreError, ValueError, OSError):
        pass
    writer = CodesWriter(path, model.n_half_latents, fingerprint)
    streams = list((probes or {}).values())

    def on_batch(batch_rows: np.ndarray, x: np.ndarray, x_hat: np.ndarray) -> None:
        for stream in streams:
            stream.add(batch_rows, x, x_hat)

    reconstruction = encode_rows(model, store, rows, batch_size, codes=writer, on_batch=on_batch if streams else None,
                                 reconstruct=probes is not None) if len(rows) else None
    return writer.finalize(pass_stats(reconstruction, None if probes is None else {kind: s.result() for kind, s in probes.items()}))


def encode_model(name: str, model: SparseModel, inputs: CellInputs, kinds: dict[str, ConceptData], settings: EvaluateSettings,
                 codes_dir: Path, timings: Timings | None = None) -> EncodedModel:
    """Step 1 for one model: every code set (`CODE_SETS`, each reused while its fingerprint holds); the test pass
    also scores the probes of every kind (`inputs.probes`; their seconds in `timings`' "probes")."""
    base = {"model": weights_digest(model), "method": model.method, "k": model.k}
    match_rows = np.unique(np.concatenate([d.match_rows for d in kinds.values()]))
    pair_ids = np.arange(len(inputs.data.pairs))

    def source(store: Store, rows: np.ndarray) -> dict[str, Any]:
        return {**base, "store": store.attrs.get("fingerprint"), "rows": rows_digest(rows)}

    streams = {kind: ProbeStream(inputs.probes.probes[kind], d, timings) for kind, d in kinds.items()}
    test_rows = inputs.data.rows("test")
    bs, folder = settings.batch_size, codes_dir / name
    test = encoded(model, inputs.embeddings, test_rows, bs, folder / "test", {**source(inputs.embeddings, test_rows), "probes": inputs.probes.fingerprint}, streams)
    reconstruction, probe_scores = pass_result(test, kinds)
    return EncodedModel(
        test=test,
        match=encoded(model, inputs.embeddings, match_rows, bs, folder / "match", source(inputs.embeddings, match_rows)),
        pairs_before=encoded(model, inputs.pairs_before, pair_ids, bs, folder / "pairs_before", source(inputs.pairs_before, pair_ids)),
        pairs_after=encoded(model, inputs.pairs_after, pair_ids, bs, folder / "pairs_after", source(inputs.pairs_after, pair_ids)),
        reconstruction=reconstruction, probes=probe_scores,
    )


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
    kinds = {kind: concept_data(inputs.data, inputs.embeddings, kind, evaluate, seed) for kind in inputs.data.kinds}
    if dict(inputs.probes.fingerprint) != probe_fingerprint(kinds, inputs.embeddings, evaluate, seed):
        raise ValueError("the linear probes (store/probes) were fitted on other rows, settings or embeddings than this evaluation reads "
                         "(evaluate.max_match_rows, evaluate.probe_max_n, seed, the dataset); rerun the probes stage (dvc repro probes)")
    start = time.perf_counter()
    with timings.part("encode"):
        trained = encode_model("trained", model, inputs, kinds, evaluate, codes_dir, timings)
        untrained = encode_model("untrained", twin, inputs, kinds, evaluate, codes_dir, timings)
    log.info("%s: codes of %d test, %d matching rows and %d pairs in %.1f s", cell.name, len(test_rows), len(trained.match),
             len(inputs.data.pairs), time.perf_counter() - start)
    if cell.rotation:
        with timings.part("fvu"):
            curve = fvu_curve({"trained": model, "untrained": twin}, inputs.embeddings, test_rows, evaluate.batch_size, sorted({*evaluate.ks, cell.k}))
    else:
        curve = [CurvePoint(name, cell.k, encoded.reconstruction.l0, encoded.reconstruction.fvu) for name, encoded in (("trained", trained), ("untrained", untrained))]
    concepts = {kind: concept_metrics(trained.variant(kind), untrained.variant(kind), d, evaluate, seed, timings) for kind, d in kinds.items()}
    start = time.perf_counter()
    # the decoder's input mean is the mean training embedding: the captions stage trains it on exactly the training split
    image_mean = inputs.decoder.input_mean.detach().cpu().numpy()
    with timings.part("explain"):
        explained = explain_run(model.cpu(), cell.k, inputs.decoder, explain_kinds(inputs, trained.test, explain, seed), inputs.concepts,
                                image_mean, explain)
    log.info("%s: explanations in %.1f s", cell.name, time.perf_counter() - start)
    return CellEvaluation(
        cell=cell, size=model.n_latents, n_test=int(len(test_rows)), best_epoch=best_epoch, device=device_name(device),
        trained=trained.reconstruction, untrained=untrained.reconstruction, concepts=concepts, curve=tuple(curve), explanations=explained,
        timings=timings.record(time.perf_counter() - started),
    )
