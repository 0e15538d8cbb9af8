"""stages.cell / pipeline.training.cell_training: the grid-cell stage's contract with dvc.yaml and the training fingerprint that
lets a cell re-evaluate without retraining (the DVC-level behaviour is tested end to end in test_e2e.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.config import validate_params
from pipeline.presets import preset_text
from pipeline.provenance import source_digest
from pipeline.training.cell_training import TRAINING_CODE, reusable, training_fingerprint

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


def test_the_code_digest_a_stage_records_covers_only_its_dvc_dependencies():
    """What data and extract record as their code (`stages.runner.code_digest`) is code DVC reruns them for."""
    from stages.data import DATA_CODE
    from stages.extract import EXTRACT_CODE

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert set(DATA_CODE) <= set(stages["data"]["deps"]) and set(EXTRACT_CODE) <= set(stages["extract"]["deps"])


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
    from pipeline.training.feed import FeedPlan

    raw = yaml.safe_load(preset_text("tiny"))
    params = validate_params(raw)
    cell = params.cells()[-1]
    rows = np.arange(10), np.arange(10, 12)
    resident = FeedPlan("resident", 1 << 30, 1000, 0, "")
    base = training_fingerprint(params, cell, {"dataset": "d"}, *rows, resident)
    assert base == training_fingerprint(validate_params(raw), cell, {"dataset": "d"}, *rows, resident)
    evaluate_changed = {**raw, "evaluate": {**raw["evaluate"], "ks": [1, 3]}}
    assert training_fingerprint(validate_params(evaluate_changed), cell, {"dataset": "d"}, *rows, resident) == base
    train_changed = {**raw, "train": {**raw["train"], "epochs": raw["train"]["epochs"] + 1}}
    assert training_fingerprint(validate_params(train_changed), cell, {"dataset": "d"}, *rows, resident) != base
    assert training_fingerprint(params, cell, {"dataset": "other"}, *rows, resident) != base
    assert training_fingerprint(params, cell, {"dataset": "d"}, np.arange(1, 11), rows[1], resident) != base
    assert training_fingerprint(params, params.cells()[0], {"dataset": "d"}, *rows, resident) != base
    # torch's CPU sums depend on the thread count, so the same model at other `threads` is another training
    assert training_fingerprint(validate_params({**raw, "threads": 2}), cell, {"dataset": "d"}, *rows, resident) != base
    # the feed: its mode and streaming's window change the batches; the memory settings only through them
    memory_changed = validate_params({**raw, "train": {**raw["train"], "feed_memory": "1GiB", "shuffle_rows": 999}})
    assert training_fingerprint(memory_changed, cell, {"dataset": "d"}, *rows, resident) == base
    streaming = FeedPlan("streaming", 1 << 30, 1000, 4, "")
    assert training_fingerprint(params, cell, {"dataset": "d"}, *rows, streaming) != base
    assert training_fingerprint(params, cell, {"dataset": "d"}, *rows, FeedPlan("streaming", 1 << 20, 10, 8, "")) not in (
        base, training_fingerprint(params, cell, {"dataset": "d"}, *rows, streaming))
    assert training_fingerprint(params, cell, {"dataset": "d"}, *rows, FeedPlan("streaming", 1 << 20, 10, 4, "other budget")) == \
        training_fingerprint(params, cell, {"dataset": "d"}, *rows, streaming)


@pytest.mark.parametrize("damage", ["none", "other_inputs", "no_weights", "no_history", "bad_json", "old_schema", "no_fingerprint",
                                    "garbage_weights", "truncated_weights", "broken_header", "no_digest"])
def test_a_checkpoint_is_reused_only_when_finished_from_the_same_inputs_and_intact(tmp_path, damage, caplog):
    from pipeline.models.checkpoint import save_model
    from pipeline.models.registry import build

    directory, history = tmp_path / "run", tmp_path / "run" / "history.json"
    save_model(build("topk", 4, 8, 2, seed=0), directory, {"fingerprint": "abc"})
    write(directory, {"history.json": "{}"})
    weights, config = directory / "model.safetensors", directory / "config.json"
    saved = json.loads(config.read_text())
    if damage == "no_weights":
        weights.unlink()
    if damage == "no_history":
        history.unlink()
    if damage == "bad_json":
        config.write_text("{not json")
    if damage == "old_schema":
        config.write_text(json.dumps({**saved, "schema_version": 1}))
    if damage == "no_fingerprint":
        config.write_text(json.dumps({**saved, "provenance": {}}))
    if damage == "no_digest":
        config.write_text(json.dumps({k: v for k, v in saved.items() if k != "weights_digest"}))
    if damage == "garbage_weights":  # same size, finite values: only the digest tells
        data = bytearray(weights.read_bytes())
        data[-16:] = np.full(4, 7.0, np.float32).tobytes()
        weights.write_bytes(bytes(data))
    if damage == "truncated_weights":
        weights.write_bytes(weights.read_bytes()[:40])
    if damage == "broken_header":
        weights.write_bytes(b"\xff" * 8 + weights.read_bytes()[8:])
    fingerprint = "other" if damage == "other_inputs" else "abc"
    with caplog.at_level("INFO", logger="pipeline.training.cell_training"):
        assert reusable(directory, fingerprint, history) == (damage == "none")
    if damage not in ("none", "other_inputs", "no_fingerprint"):
        assert f"{directory}: checkpoint cannot be reused" in caplog.text and "training it again" in caplog.text
    assert not reusable(tmp_path / "missing", "abc", history)
