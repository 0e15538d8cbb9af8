"""pipeline.config and the `cedar` CLI: every bad params.yaml fails with one line naming the key."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from cli.main import main as cli
from pipeline.config import ParamsError, load_params, validate_params
from pipeline.presets import preset_names, preset_text

ROOT = Path(__file__).resolve().parents[1]


def tiny() -> dict:
    return yaml.safe_load(preset_text("tiny"))


def error_of(raw: dict) -> str:
    with pytest.raises(ParamsError) as e:
        validate_params(raw)
    return str(e.value)


@pytest.mark.parametrize("name", ["default", "tiny"])
def test_shipped_presets_validate(name):
    params = validate_params(yaml.safe_load(preset_text(name)))
    assert params.cells()


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_has_every_section_dvc_yaml_reads(name):
    """`dvc repro` refuses a params.yaml without a section a stage lists (even one a source does not use)."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    read = {key.split(".")[0] for stage in stages.values() for key in stage.get("params", []) if isinstance(key, str)}
    assert read - set(yaml.safe_load(preset_text(name))) == set()


def test_repository_params_yaml_is_valid():
    assert load_params(ROOT / "params.yaml").cells()


def test_grid_cells_are_named_like_the_dvc_matrix_stages():
    params = validate_params(tiny())
    assert [r.name for r in params.cells()] == ["cedar-4", "topk-32-4"]
    assert params.cells()[0].size == params.d == 16
    assert params.cell("topk", 32, 4).name == "topk-32-4"
    with pytest.raises(ValueError, match="no grid cell method=topk size=64 k=4"):
        params.cell("topk", 64, 4)


def test_unknown_key_is_named():
    raw = tiny()
    raw["train"]["learning_rate"] = 0.1
    assert error_of(raw) == "params.yaml: train.learning_rate: unknown key"


def test_wrong_type_is_named():
    raw = tiny()
    raw["data"]["kinds"]["objects"]["n_images"] = "many"
    assert error_of(raw).startswith("params.yaml: data.kinds.objects.n_images: Input should be a valid integer")


def test_k_larger_than_dictionary_size_is_rejected():
    raw = tiny()
    raw["sweep"]["sae"]["ks"] = [4, 64]
    assert "sweep.sae.ks[1]: k=64 > dictionary size 32" in error_of(raw)


def test_k_below_one_and_rotation_k_above_d_are_rejected():
    raw = tiny()
    raw["sweep"]["sae"]["ks"] = [0]
    raw["sweep"]["rotation"]["ks"] = [17]
    message = error_of(raw)
    assert "sweep.sae.ks[0]: k must be >= 1, got 0" in message
    assert "sweep.rotation.ks[0]: k=17 must be in 1..d=16 (the encoder's embedding dimension)" in message


def test_empty_grid_is_rejected():
    raw = tiny()
    raw["sweep"]["sae"]["dict_sizes"] = []
    assert "sweep.sae.dict_sizes: Tuple should have at least 1 item" in error_of(raw)


def test_unknown_method_and_missing_method_entry():
    raw = tiny()
    raw["sweep"]["sae"]["methods"] = ["topk", "nope"]
    assert "sweep.sae.methods[1]: 'nope' is not an SAE method" in error_of(raw)
    raw = tiny()
    del raw["methods"]["topk"]
    assert "methods.topk: missing" in error_of(raw)


def test_method_options_are_checked_against_the_model_signature():
    raw = tiny()
    raw["methods"]["cedar"] = {"no_such_option": 1}
    assert "methods.cedar.no_such_option: unknown key" in error_of(raw)
    raw = tiny()
    raw["methods"]["topk"] = {"train": {"lr": -1}}
    assert "methods.topk.train.lr: expected a finite number > 0 or 'auto', got -1" in error_of(raw)


def test_per_method_train_overrides_apply():
    raw = tiny()
    raw["methods"]["topk"] = {"train": {"lr": 0.01, "epochs": 2}}
    params = validate_params(raw)
    assert params.train_settings("topk").lr == 0.01 and params.train_settings("topk").epochs == 2
    assert params.train_settings("cedar").lr == raw["methods"]["cedar"]["train"]["lr"] != raw["train"]["lr"]
    del raw["methods"]["cedar"]["train"]
    assert validate_params(raw).train_settings("cedar").lr == raw["train"]["lr"]


def test_more_pairs_than_test_images_is_rejected():
    raw = tiny()
    raw["data"]["kinds"]["multi"]["n_pairs"] = 500
    assert "data: kinds.multi.n_pairs=500 > about 24 test images" in error_of(raw)


def test_evaluate_tapas_rule_must_be_reported():
    raw = tiny()
    raw["evaluate"]["tapas_k"] = 9
    assert "evaluate: tapas_k=9 must be one of match_ks [1, 2, 3, 4, 5]" in error_of(raw)


def test_bad_split_and_broken_yaml(tmp_path):
    raw = tiny()
    raw["data"]["split"] = [0.5, 0.2, 0.2]
    assert "data.split: train/val/test fractions must be positive and sum to 1" in error_of(raw)
    broken = tmp_path / "params.yaml"
    broken.write_text("seed: [1,\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params(broken)
    with pytest.raises(ParamsError, match="no such file"):
        load_params(tmp_path / "missing.yaml")


def test_real_data_source_and_pretrained_encoder(tmp_path):
    raw = tiny()
    raw["data"] = {"source": "cub", "root": str(tmp_path / "missing")}
    assert "data.root: " not in error_of(raw) and f"data: root: {tmp_path / 'missing'}: no such file or directory" in error_of(raw)
    raw["data"] = {"source": "folders", "root": str(tmp_path)}
    assert f"data: root: {tmp_path}: no image files under it" in error_of(raw)
    (tmp_path / "red" / "a.png").parent.mkdir()
    (tmp_path / "red" / "a.png").write_bytes(b"")  # only names are looked at here; the data stage decodes
    raw["encoder"] = {"kind": "open_clip", "arch": "ViT-B-32", "weights": "laion2b_s34b_b79k"}
    params = validate_params(raw)
    assert params.d is None and params.encoder.arch == "ViT-B-32"
    raw["encoder"] = {"kind": "dinov2"}
    assert "encoder: dinov2 needs `model`" in error_of(raw)


def test_cli_validate_and_preset(tmp_path, capsys):
    target = tmp_path / "params.yaml"
    assert cli(["preset", "tiny", "--params", str(target)]) == 0
    assert cli(["validate", str(target)]) == 0
    assert "2 grid cells" in capsys.readouterr().out
    assert cli(["preset", "default", "--params", str(target)]) == 0  # an unedited preset may be replaced
    edited = copy.deepcopy(yaml.safe_load(target.read_text()))
    edited["seed"] = 7
    target.write_text(yaml.safe_dump(edited))
    assert cli(["preset", "tiny", "--params", str(target)]) == 2
    assert "local edits" in capsys.readouterr().err
    assert cli(["preset", "tiny", "--params", str(target), "--force"]) == 0
    assert target.read_text() == preset_text("tiny")
    target.write_text("seed: 1\ndata: {kinds: {objects: {n_images: 100}}}\nsweep: {rotation: {methods: [cedar], ks: [999]}, sae: {methods: [topk], dict_sizes: [8], ks: [4]}}\nmethods: {cedar: {}, topk: {}}\n")
    assert cli(["validate", str(target)]) == 2
    assert "sweep.rotation.ks[0]: k=999" in capsys.readouterr().err


def test_the_options_registry_names_every_model_and_its_options_class():
    """`pipeline.models.options.OPTIONS` (what the light schema checks `methods.<m>` against) and the model registry
    (what the stages build) list the same methods, each model's `Options` being its entry."""
    from pipeline.models.options import OPTIONS, ROTATION_METHODS
    from pipeline.models.registry import METHODS

    assert set(OPTIONS) == set(METHODS)
    assert {m: METHODS[m].Options for m in METHODS} == OPTIONS
    assert ROTATION_METHODS == {m for m, cls in METHODS.items() if cls.signed}
