"""stages.cell / stages.train: the grid-cell stage's contract with dvc.yaml and the training fingerprint that
lets a cell re-evaluate without retraining (the DVC-level behaviour is tested end to end in test_e2e.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.config import validate_params
from pipeline.provenance import source_digest
from stages.cli import preset_text
from stages.train import TRAINING_CODE, recorded_fingerprint, training_fingerprint

ROOT = Path(__file__).resolve().parents[1]


def cell_stages() -> dict:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    return {name: stages[name] for name in ("rotation", "sae")}


def test_cell_stages_depend_on_all_training_code_and_keep_their_model():
    for name, stage in cell_stages().items():
        assert stage["cmd"].startswith("python -m stages.cell "), name
        assert set(TRAINING_CODE) <= set(stage["deps"]), f"{name}: dvc.yaml must list every TRAINING_CODE path"
        assert {"stages/cell.py", "stages/evaluate.py", "pipeline/metrics", "store/captions"} <= set(stage["deps"])
        assert {"train", "evaluate", "explain", "methods.${item.method}"} <= set(stage["params"])
        (model_out,) = stage["outs"]
        ((path, options),) = model_out.items()
        assert path.startswith("store/models/") and options == {"persist": True}, "the model must survive a rerun"


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_source_digest_changes_with_any_training_source_and_only_with_it(tmp_path):
    write(tmp_path, {"pkg/models/a.py": "x = 1\n", "pkg/models/notes.txt": "ignored", "pkg/train.py": "y = 2\n", "pkg/other.py": "z = 3\n"})
    paths = ("pkg/models", "pkg/train.py")
    base = source_digest(paths, tmp_path)
    assert base == source_digest(paths, tmp_path) and len(base) == 16
    write(tmp_path, {"pkg/other.py": "z = 4\n", "pkg/models/notes.txt": "edited"})
    assert source_digest(paths, tmp_path) == base, "files outside the training code (and non-.py files) do not count"
    write(tmp_path, {"pkg/models/a.py": "x = 2\n"})
    edited = source_digest(paths, tmp_path)
    assert edited != base
    write(tmp_path, {"pkg/models/b.py": ""})
    assert source_digest(paths, tmp_path) != edited, "a new module in a training folder counts"


def test_training_fingerprint_follows_training_inputs_not_evaluation_params():
    raw = yaml.safe_load(preset_text("tiny"))
    params = validate_params(raw)
    cell = params.cells()[-1]
    rows = np.arange(10), np.arange(10, 12)
    base = training_fingerprint(params, cell, {"dataset": "d"}, *rows)
    assert base == training_fingerprint(validate_params(raw), cell, {"dataset": "d"}, *rows)
    evaluate_changed = {**raw, "evaluate": {**raw["evaluate"], "ks": [1, 3]}}
    assert training_fingerprint(validate_params(evaluate_changed), cell, {"dataset": "d"}, *rows) == base
    train_changed = {**raw, "train": {**raw["train"], "epochs": raw["train"]["epochs"] + 1}}
    assert training_fingerprint(validate_params(train_changed), cell, {"dataset": "d"}, *rows) != base
    assert training_fingerprint(params, cell, {"dataset": "other"}, *rows) != base
    assert training_fingerprint(params, cell, {"dataset": "d"}, np.arange(1, 11), rows[1]) != base
    assert training_fingerprint(params, params.cells()[0], {"dataset": "d"}, *rows) != base


@pytest.mark.parametrize("damage", ["none", "no_weights", "no_history", "bad_json", "old_schema", "no_fingerprint"])
def test_recorded_fingerprint_only_from_a_finished_readable_checkpoint(tmp_path, damage):
    from pipeline.models.checkpoint import SCHEMA_VERSION

    config = {"schema_version": SCHEMA_VERSION, "provenance": {"fingerprint": "abc"}}
    files = {"model.safetensors": "w", "history.json": "{}", "config.json": json.dumps(config)}
    if damage == "no_weights":
        files.pop("model.safetensors")
    if damage == "no_history":
        files.pop("history.json")
    if damage == "bad_json":
        files["config.json"] = "{not json"
    if damage == "old_schema":
        files["config.json"] = json.dumps({**config, "schema_version": -1})
    if damage == "no_fingerprint":
        files["config.json"] = json.dumps({**config, "provenance": {}})
    write(tmp_path, files)
    assert recorded_fingerprint(tmp_path) == ("abc" if damage == "none" else None)
    assert recorded_fingerprint(tmp_path / "missing") is None
