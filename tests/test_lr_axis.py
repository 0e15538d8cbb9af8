"""The learning-rate axis (params.yaml `methods.<m>.train.lr: [..]`): the schema, the choice on validation FVU, resumption
after a kill, and the axis through a grid cell's training on the synthetic tiny preset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from pipeline.config import validate_params
from pipeline.grid import Cell
from pipeline.models.checkpoint import load_model
from pipeline.models.registry import build
from pipeline.paths import Layout
from pipeline.presets import preset_text
from pipeline.training.feed import FeedPlan
from pipeline.training.loop import TrainResult
from pipeline.training.lr_axis import rank, train_lr_axis
from pipeline.training.options import TrainSettings, lr_axis
from tests.test_config import error_of, tiny


# --- the schema -----------------------------------------------------------------------------------------------------
def test_a_list_of_learning_rates_is_one_candidate_per_rate_with_the_other_settings_shared():
    raw = tiny()
    raw["methods"]["topk"] = {"train": {"lr": [0.001, "auto", 0.03], "epochs": 2}}
    params = validate_params(raw)
    candidates = params.train_candidates("topk")
    assert [c.lr for c in candidates] == [0.001, "auto", 0.03]
    assert {c.epochs for c in candidates} == {2} and {c.batch_size for c in candidates} == {raw["train"]["batch_size"]}
    assert params.train_settings("topk") == candidates[0], "one settings object: the first candidate's"
    assert [c.lr for c in params.train_candidates("cedar")] == [raw["methods"]["cedar"]["train"]["lr"]], "a number is an axis of one"


@pytest.mark.parametrize("value,line", [
    ([], "methods.topk.train.lr: expected at least one learning rate, got an empty list"),
    ([0.01, -1], "methods.topk.train.lr[1]: expected a finite number > 0 or 'auto', got -1"),
    ([0.01, True], "methods.topk.train.lr[1]: expected a finite number > 0 or 'auto', got True"),
    ([0.01, 0.01], "methods.topk.train.lr: learning rates listed twice: 0.01"),
    ("fast", "methods.topk.train.lr: expected a finite number > 0 or 'auto', got 'fast'"),
])
def test_a_bad_learning_rate_axis_is_refused_in_one_line_naming_the_item(value, line):
    raw = tiny()
    raw["methods"]["topk"] = {"train": {"lr": value}}
    assert line in error_of(raw)


def test_lr_axis_by_hand():
    assert lr_axis(0.01) == (0.01,) and lr_axis("auto") == ("auto",) and lr_axis([1, "auto"]) == (1.0, "auto")


def test_the_schema_still_loads_no_torch():
    """lr_axis lives in the light options module (tests/test_architecture.py checks the whole schema's imports)."""
    import ast

    source = Path(__file__).resolve().parents[1] / "pipeline" / "training" / "options.py"
    imported = {node.module for node in ast.walk(ast.parse(source.read_text())) if isinstance(node, ast.ImportFrom)}
    assert not any(name and name.split(".")[0] in {"torch", "sklearn", "scipy", "zarr"} for name in imported)


# --- the choice -------------------------------------------------------------------------------------------------------
def result(val_fvus: list[float], best_epoch: int) -> TrainResult:
    history = [{"epoch": i + 1, "val_fvu": v, "val_l0": 4.0} for i, v in enumerate(val_fvus)]
    return TrainResult(build("topk", 4, 8, 2, seed=0), history, best_epoch, False)


def test_rank_by_hand():
    assert rank(result([0.5, 0.2, 0.3], 2)) == (0, 0.2), "the kept epoch's validation FVU"
    assert rank(result([0.5, 0.1], -1)) == (1, 0.1), "no accepted epoch: after every accepted run, by the last epoch"


def fake_axis(outcomes: dict[float, TrainResult]):
    calls: list[tuple[float, Path]] = []

    def train_one(settings: TrainSettings, work: Path) -> TrainResult:
        calls.append((settings.lr, work))
        return outcomes[settings.lr]

    return train_one, calls


def test_the_run_with_the_lowest_accepted_validation_fvu_is_kept_and_every_run_is_recorded(tmp_path):
    outcomes = {0.001: result([0.4, 0.3], 2), 0.01: result([0.3, 0.05], -1), 0.1: result([0.2, 0.25], 1), 0.3: result([0.2], 1)}
    train_one, calls = fake_axis(outcomes)
    candidates = [TrainSettings(lr=lr) for lr in outcomes]
    choice = train_lr_axis(candidates, train_one, tmp_path / "work", "fp")
    assert choice.result is outcomes[0.1] and choice.settings.lr == 0.1, "0.01 reached 0.05 only in an epoch the model refused; 0.3 ties 0.1 and comes later"
    assert [c for c, _ in calls] == [0.001, 0.01, 0.1, 0.3] and len({w for _, w in calls}) == 4, "each candidate checkpoints in its own folder"
    assert choice.record["lr"] == 0.1
    assert [(s["lr"], s["val_fvu"], s["best_epoch"]) for s in choice.record["lr_axis"]] == [(0.001, 0.3, 2), (0.01, 0.05, -1), (0.1, 0.2, 1), (0.3, 0.2, 1)]
    assert all(s["history"] == outcomes[s["lr"]].history for s in choice.record["lr_axis"])


def test_one_candidate_trains_in_the_work_folder_itself(tmp_path):
    train_one, calls = fake_axis({0.01: result([0.3], 1)})
    choice = train_lr_axis([TrainSettings(lr=0.01)], train_one, tmp_path / "work", "fp")
    assert calls == [(0.01, tmp_path / "work")] and [s["lr"] for s in choice.record["lr_axis"]] == [0.01]
    assert not (tmp_path / "work").exists(), "nothing saved beside the run's own epoch checkpoints"


def test_a_rerun_after_a_kill_reuses_the_finished_candidates_and_only_them(tmp_path):
    outcomes = {0.001: result([0.4, 0.3], 2), 0.01: result([0.1], 1), 0.1: result([0.2], 1)}
    work = tmp_path / "work"
    first, calls = fake_axis(outcomes)

    def killed(settings: TrainSettings, folder: Path) -> TrainResult:
        if settings.lr == 0.1:
            raise KeyboardInterrupt  # the kill, in the third candidate
        return first(settings, folder)

    with pytest.raises(KeyboardInterrupt):
        train_lr_axis([TrainSettings(lr=lr) for lr in outcomes], killed, work, "fp")
    again, calls = fake_axis(outcomes)
    choice = train_lr_axis([TrainSettings(lr=lr) for lr in outcomes], again, work, "fp")
    assert [c for c, _ in calls] == [0.1], "the two finished candidates were reused"
    assert choice.settings.lr == 0.01 and choice.result.history == outcomes[0.01].history and choice.result.best_epoch == 1
    reused = choice.result.module
    assert all(torch.equal(a, b) for a, b in zip(reused.state_dict().values(), outcomes[0.01].module.state_dict().values()))
    other, calls = fake_axis(outcomes)
    train_lr_axis([TrainSettings(lr=lr) for lr in outcomes], other, work, "other inputs")
    assert [c for c, _ in calls] == [0.001, 0.01, 0.1], "candidates trained from other inputs are not reused"


def test_a_damaged_finished_candidate_is_trained_again_with_a_warning(tmp_path, caplog):
    outcomes = {0.001: result([0.4], 1), 0.01: result([0.1], 1)}
    work = tmp_path / "work"
    train_lr_axis([TrainSettings(lr=lr) for lr in outcomes], fake_axis(outcomes)[0], work, "fp")
    weights = work / "lr-0.done" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-8] + bytes(b ^ 0xFF for b in data[-8:]))
    train_one, calls = fake_axis(outcomes)
    train_lr_axis([TrainSettings(lr=lr) for lr in outcomes], train_one, work, "fp")
    assert [c for c, _ in calls] == [0.001] and "lr-0.done: finished candidate cannot be reused" in caplog.text


# --- through a grid cell --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def synthetic_project(tmp_path_factory) -> tuple[Path, dict]:
    """The synthetic tiny preset's data and extract stages (extract links the source's embeddings; no encoder needed):
    embeddings to train grid cells on."""
    from stages import data, extract

    root = tmp_path_factory.mktemp("lr_axis")
    raw = yaml.safe_load(preset_text("synthetic-tiny"))
    params = validate_params(raw)
    layout = Layout(root)
    for stage in (data, extract):
        stage.run(params, layout)
    return root, raw


def test_a_grid_cell_trains_every_learning_rate_and_keeps_the_best_on_validation(synthetic_project):
    from pipeline.training.cell_training import train_cell, training_fingerprint

    root, raw = synthetic_project
    raw = {**raw, "methods": {**raw["methods"], "topk": {"train": {"lr": [0.0003, 0.01], "epochs": 3, "min_steps": 0}}}}
    params = validate_params(raw)
    layout = Layout(root)
    cell = Cell(method="topk", size=32, k=4, rotation=False)
    out = train_cell(params, layout, cell)
    history = json.loads(layout.model_history(cell.name).read_text())
    axis = history["lr_axis"]
    assert [s["lr"] for s in axis] == [0.0003, 0.01] and all(len(s["history"]) == 3 for s in axis)
    best = min(axis, key=lambda s: s["val_fvu"])
    assert history["lr"] == best["lr"] and history["history"] == best["history"], "the kept run is the one of lowest validation FVU"
    assert axis[0]["val_fvu"] != axis[1]["val_fvu"]
    assert not layout.model_work(cell.name).exists(), "the candidates' work folders are removed with the run's"

    # the kept model is exactly what training that learning rate alone gives
    alone = {**raw, "methods": {**raw["methods"], "topk": {"train": {"lr": best["lr"], "epochs": 3, "min_steps": 0}}}}
    single = Layout(root / "alone")
    for name in ("data", "embeddings"):
        (single.store / name).parent.mkdir(parents=True, exist_ok=True)
        (single.store / name).symlink_to(layout.store / name)
    train_cell(validate_params(alone), single, cell)
    kept, reference = load_model(out), load_model(single.model(cell.name))
    assert all(torch.equal(a, b) for a, b in zip(kept.state_dict().values(), reference.state_dict().values()))

    # the fingerprint covers the axis: another list retrains, the same one reuses
    rows = np.arange(10), np.arange(10, 12)
    resident = FeedPlan("resident", 1 << 30, 1000, 0, "")
    other = {**raw, "methods": {**raw["methods"], "topk": {"train": {"lr": [0.0003, 0.02], "epochs": 3, "min_steps": 0}}}}
    assert training_fingerprint(validate_params(other), cell, "e", *rows, resident) != training_fingerprint(params, cell, "e", *rows, resident)
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    train_cell(params, layout, cell)
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime, "the same axis reuses the trained model"
