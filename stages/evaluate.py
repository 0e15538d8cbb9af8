"""Evaluation of one grid cell (run by `stages.cell`): metrics of the trained run, its untrained twin and random codes.

Reconstruction (test split): for the trained model and the untrained model of the same method,
size and seed (initial weights, data-dependent init only, same sparsifier): dataset-level FVU
(float64), mean L0 and dead-latent fraction at the run's k; for rotation methods the FVU-vs-K
curve at every `evaluate.ks` from the one trained rotation.
Concepts (`pipeline.evaluation`): MATCHScores (FBMP for each beta and k, one-to-one),
Delta-MATCHScore, TAPAScore and Delta-stay on the intervention pairs, CKNNA, FMS and linear-probe
loss, for trained, untrained and random codes.
Explanations (`pipeline.explanations`, with the caption decoder of the captions stage and the concept
vocabulary's text embeddings): latent names, relevance of named concepts, captions from the dense
embedding / the sparse reconstruction / top-k in the original basis and their "describes the image"
rates, example images and the latents that switch across intervention pairs.
Outputs store/eval/<run>/metrics.json (DVC metrics), fvu_curve.json (DVC plots) and explain.json.
Reads params: seed, evaluate, explain.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from pipeline.config import Params, Run
from pipeline.dataset import Dataset, open_dataset, sample_rows
from pipeline.evaluation import ConceptData, ConceptSettings, concept_metrics
from pipeline.explain.captions import CaptionDecoder, load_decoder
from pipeline.explanations import Concepts, KindData, edit_text, explain_rows, explain_run
from pipeline.metrics.reconstruction import ReconstructionAccumulator
from pipeline.models import build
from pipeline.models.base import SparseModel
from pipeline.models.checkpoint import load_model, read_config
from pipeline.paths import Layout
from pipeline.store import Store, open_store, replace_dir

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
    init_rows = sample_rows(train_rows, params.train_settings(cell.method).init_samples, params.seed)
    model.fit_init(torch.as_tensor(store.take(init_rows), dtype=torch.float32))
    return model.eval()


def concept_data(params: Params, data: Dataset, kind: str, pair_codes: tuple[np.ndarray, np.ndarray], store: Store) -> ConceptData:
    """One kind's matching rows (training split, subsampled), test rows and pairs, with labels restricted
    to that kind's columns (attribute indices local to them)."""
    train_rows, test_rows = data.rows("train", kind), data.rows("test", kind)
    match_rows = sample_rows(train_rows, params.evaluate.max_match_rows, params.seed)
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


def explain_kinds(params: Params, data: Dataset, store: Store, pair_codes: tuple[np.ndarray, np.ndarray]) -> list[KindData]:
    """Each kind's test images (the seeded subsample `explain_rows`: the same rows for every run) and its
    first `explain.pairs` intervention pairs, with labels restricted to the kind's columns. Captions of a
    kind with complete labels (one-hot families) are judged against every column of the dataset (the
    other kinds' attributes are false on its rows); those of a multi-label kind against its own columns."""
    settings, pairs, names = params.explain, data.pairs, data.attribute_names
    all_families: dict[str, list[int]] = {}
    for kind in data.kinds:
        for family, cols in data.families(kind).items():
            all_families.setdefault(family, []).extend(cols)
    kinds = []
    for kind in data.kinds:
        test = data.rows("test", kind)
        if len(test) == 0:
            continue
        rows = test[explain_rows(len(test), settings.max_rows, params.seed)]
        columns = np.asarray(data.columns(kind))
        first = int(columns[0])
        which = pairs.of_kind(kind)[: settings.pairs]
        kinds.append(KindData(
            kind=kind, rows=rows, x=store.take(rows), attributes=data.attributes[rows][:, columns],
            attribute_names=[names[c] for c in columns], families={f: [c - first for c in cols] for f, cols in data.families(kind).items()},
            truth=[data.captions[i] for i in rows], scored=data.one_hot(kind),
            pair_ids=which, pairs_before=pair_codes[0][which], pairs_after=pair_codes[1][which],
            pair_edits=[edit_text(names, int(pairs.removed[i]), int(pairs.added[i])) for i in which],
            **({"caption_attributes": data.attributes[rows], "caption_names": list(names), "caption_families": all_families} if data.one_hot(kind) else {}),
        ))
    return kinds


def read_concepts(layout: Layout) -> Concepts | None:
    """The concept vocabulary's texts and text embeddings (store/embeddings/concepts.zarr), or None with a
    warning when the encoder has no text tower (extract then writes no concepts.zarr): latents stay unnamed."""
    path = layout.embeddings / "concepts.zarr"
    if not path.exists():
        log.warning("%s: missing (the encoder has no text tower): latents stay unnamed", path)
        return None
    vocabulary = open_store(path)
    texts = vocabulary.attrs.get("texts")
    if not isinstance(texts, list) or len(texts) != len(vocabulary):
        raise ValueError(f"{path}: expected attrs['texts'] with one text per row ({len(vocabulary)}), got {type(texts).__name__}")
    return Concepts(texts=[str(t) for t in texts], embeddings=vocabulary.read())


def explanations(params: Params, cell: Run, model: SparseModel, decoder: CaptionDecoder, concepts: Concepts | None, kinds: list[KindData]) -> dict[str, Any]:
    """The run's explain.json content (see pipeline.explanations)."""
    start = time.perf_counter()
    # the decoder's input mean is the mean training embedding: the captions stage trains it on exactly the training split
    image_mean = decoder.input_mean.detach().cpu().numpy()
    result = explain_run(model, cell.k, decoder, kinds, concepts, image_mean, params.explain.settings())
    log.info("%s: explanations in %.1f s", cell.name, time.perf_counter() - start)
    return {"run": cell.name, "method": cell.method, **result}


def run(params: Params, layout: Layout, cell: Run) -> dict[str, Any]:
    data = open_dataset(layout.data)
    store = open_store(layout.embeddings / "images.zarr")
    model_dir = layout.models / cell.name
    config = read_config(model_dir)
    model = load_model(model_dir)
    decoder, vocabulary = load_decoder(layout.captions), read_concepts(layout)  # before the long work: fail fast
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
    explained = explanations(params, cell, model, decoder, vocabulary, explain_kinds(params, data, store, pair_codes))
    out = layout.evals / cell.name
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    (tmp / "metrics.json").write_text(json.dumps(metrics, indent=1))
    (tmp / "fvu_curve.json").write_text(json.dumps(curve, indent=1))
    (tmp / "explain.json").write_text(json.dumps(explained, indent=1))
    replace_dir(tmp, out)
    log.info("%s: FVU %.4f at L0 %.1f (untrained %.4f)", cell.name, trained["fvu"], trained["l0"], untrained["fvu"])
    for kind, c in concepts.items():
        log.info("%s %s: MATCHScore %.3f (delta %.3f), TAPAScore %s", cell.name, kind, c["trained"]["match_score"], c["delta_match_score"],
                 (c["trained"]["tapas"] or {}).get("score"))
    for kind, rates in explained["describes"].items():
        log.info("%s %s: describes the image: dense %.3f, sparse %.3f, top-k original basis %.3f", cell.name, kind,
                 rates["dense"], rates["sparse"], rates["topk_original"])
    return metrics
