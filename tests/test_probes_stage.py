"""The probes stage: the linear probes of every kind, fitted once per dataset (stages/probes.py), written and read back
exactly (pipeline/scoring/probe_files.py), and an evaluation that refuses probes fitted on other rows or settings."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
import yaml

from pipeline.config import validate_params
from pipeline.data.dataset import open_dataset
from pipeline.metrics.probe import probe_scores
from pipeline.paths import Layout
from pipeline.presets import preset_text
from pipeline.scoring.cell_evaluation import concept_data, fit_kind_probes, probe_fingerprint
from pipeline.scoring.concepts import fit_family_probes
from pipeline.scoring.probe_files import META, TENSORS, FittedProbes, load_probes, save_probes
from pipeline.store import open_store


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> tuple:
    """The synthetic-tiny preset through data, encoder (none), extract (links), captions and probes."""
    from stages import captions, data, encoder, extract, probes

    root = tmp_path_factory.mktemp("probes")
    (root / "params.yaml").write_text(preset_text("synthetic-tiny"))
    params = validate_params(yaml.safe_load(preset_text("synthetic-tiny")))
    layout = Layout(root)
    for stage in (data, encoder, extract, captions):
        stage.run(params, layout)
    fitted = probes.run(params, layout)
    return params, layout, fitted


def test_the_stage_fits_each_kinds_probes_as_an_evaluation_would_and_they_read_back_exactly(project):
    params, layout, fitted = project
    data, store = open_dataset(layout.data), open_store(layout.image_embeddings)
    (kind,) = data.kinds
    d = concept_data(data, store, kind, params.evaluate, params.seed)
    alone = fit_family_probes(d, params.seed, params.evaluate.probe_max_n)
    assert torch.equal(fitted.probes[kind].weight, alone.weight) and torch.equal(fitted.probes[kind].bias, alone.bias)
    assert fitted.fingerprint == probe_fingerprint({kind: d}, store, params.evaluate, params.seed)

    read = load_probes(layout.probes)
    assert read.fingerprint == fitted.fingerprint
    mine, theirs = read.probes[kind], fitted.probes[kind]
    for field in ("weight", "bias", "columns", "real"):
        assert torch.equal(getattr(mine, field), getattr(theirs, field)), field
    assert mine.iterations == theirs.iterations and all(np.array_equal(a, b) for a, b in zip(mine.classes, theirs.classes))
    x = store.take(d.test_rows).astype(np.float32)
    labels = np.stack([np.argmax(d.labels(d.test_rows)[:, cols], axis=1) for cols in d.families.values()], axis=1)
    assert probe_scores(mine, x, x * 0.9, labels) == probe_scores(theirs, x, x * 0.9, labels), "the same scores from the file"


def test_a_kind_without_families_has_no_probe_and_round_trips_as_none(tmp_path, project):
    _, _, fitted = project
    (kind,) = fitted.probes
    save_probes(tmp_path, FittedProbes(probes={**fitted.probes, "objects": None}, fingerprint={"any": 1}))
    read = load_probes(tmp_path)
    assert read.probes["objects"] is None and read.probes[kind] is not None and read.fingerprint == {"any": 1}


def test_missing_or_corrupt_probes_name_the_folder_and_the_stage(tmp_path, project):
    _, layout, _ = project
    with pytest.raises(FileNotFoundError, match=r"probes\.json: missing; the probes stage writes it \(dvc repro probes"):
        load_probes(tmp_path)
    for name in (META, TENSORS):
        (tmp_path / name).write_bytes((layout.probes / name).read_bytes())
    meta = json.loads((tmp_path / META).read_text())
    del meta["fingerprint"]
    (tmp_path / META).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="unreadable probes .*rerun the probes stage"):
        load_probes(tmp_path)


def test_the_stage_writes_the_same_bytes_twice(project, tmp_path):
    from stages import probes

    params, layout, _ = project
    first = {name: (layout.probes / name).read_bytes() for name in (META, TENSORS)}
    probes.run(params, layout)
    assert {name: (layout.probes / name).read_bytes() for name in (META, TENSORS)} == first


def test_an_evaluation_refuses_probes_fitted_with_other_settings_and_a_cell_stops_before_training(project, tmp_path):
    from stages import cell, evaluate

    params, layout, _ = project
    data, store = open_dataset(layout.data), open_store(layout.image_embeddings)
    other = dataclasses.replace(params.evaluate, probe_max_n=50)
    stale = fit_kind_probes(data, store, params.evaluate, params.seed)
    kinds = {kind: concept_data(data, store, kind, other, params.seed) for kind in data.kinds}
    assert stale.fingerprint != probe_fingerprint(kinds, store, other, params.seed)

    raw = yaml.safe_load(preset_text("synthetic-tiny"))
    raw["evaluate"]["probe_max_n"] = 50
    changed = validate_params(raw)
    run = changed.cells()[0]
    from pipeline.training.cell_training import train_cell

    train_cell(changed, layout, run)
    with pytest.raises(ValueError, match=r"fitted on other rows, settings or embeddings .*rerun the probes stage \(dvc repro probes\)"):
        evaluate.run(changed, layout, run)
    assert not layout.run_metrics(run.name).exists(), "nothing is written"

    bare = Layout(tmp_path)
    for source, target in ((layout.data, bare.data), (layout.image_embeddings, bare.image_embeddings), (layout.captions, bare.captions)):
        if source.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source.resolve(), target_is_directory=True)
    with pytest.raises(FileNotFoundError, match=r"store/probes: missing; the probes stage writes it"):
        cell.run(params, bare, run)
    assert not bare.model(run.name).exists(), "stopped before training"
