"""Stages on a real-data source (image folders, one corrupt file) and a pretrained (open_clip) encoder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
import yaml
from PIL import Image
from safetensors.torch import save_file

from cli.main import main as cli
from pipeline.config import validate_params
from pipeline.data.dataset import open_dataset
from pipeline.paths import Layout
from pipeline.presets import preset_text
from pipeline.store import open_store
from stages import data as data_stage
from stages import encoder as encoder_stage
from stages import extract as extract_stage
from stages.data import main as data_main

ARCH = "tiny-vit-stage-test"
CONFIG = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("folders")
    rng = np.random.default_rng(0)
    for name, colour in [("red_ball", (210, 30, 30)), ("blue_box", (30, 30, 210))]:
        (root / name).mkdir()
        for i in range(12):
            Image.fromarray(np.clip(np.array(colour) + rng.normal(0, 20, (40, 52, 3)), 0, 255).astype(np.uint8)).save(root / name / f"{i}.png")
    (root / "red_ball" / "corrupt.png").write_bytes(b"\x89PNG but not really")
    return root


def params_for(folders: Path, tmp_path: Path, **data) -> tuple:
    raw = yaml.safe_load(preset_text("tiny"))
    raw["data"] = {"source": "folders", "root": str(folders), "image_size": 32, "split": [0.5, 0.25, 0.25], "workers": 0, **data}
    raw["evaluate"]["cknna_k"] = 3  # 6 test images: CKNNA needs k + 1
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return validate_params(raw), path


def test_folder_source_skips_and_lists_a_corrupt_image(folders, tmp_path):
    params, _ = params_for(folders, tmp_path)
    layout = Layout(tmp_path)
    data_stage.run(params, layout)
    data = open_dataset(layout.data)
    assert data.kinds == ["folders"] and data.images.shape == (24, 32, 32, 3)
    assert data.attribute_names == ["blue box", "red ball"] and data.one_hot("folders")
    bad = json.loads((layout.data / "bad_images.json").read_text())
    assert [Path(b["path"]).name for b in bad] == ["corrupt.png"]
    red = data.attributes[:, 1]
    assert red.sum() == 12, "the corrupt red image's row is dropped, labels stay aligned"
    assert (data.images.read()[red][..., 0].mean() > 150) and (data.images.read()[~red][..., 2].mean() > 150)


def test_folder_source_fails_before_any_work_when_asked(folders, tmp_path, capsys):
    _, path = params_for(folders, tmp_path, on_bad_image="fail")
    assert data_main(["--params", str(path), "--root", str(tmp_path)]) == 2
    assert "corrupt.png" in capsys.readouterr().err
    assert not (tmp_path / "store" / "data").exists()


def test_a_dataset_too_small_for_the_evaluation_is_refused_before_anything_is_written(folders, tmp_path, capsys):
    _, path = params_for(folders, tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["evaluate"]["cknna_k"] = 10
    path.write_text(yaml.safe_dump(raw))
    assert cli(["validate", str(path)]) == 2  # counted from the folder listing (the corrupt file still counts there)
    assert capsys.readouterr().err.strip() == (f"error: {path}: data.root: {folders}: 6 test images of kind folders (split [0.5, 0.25, 0.25]); "
                                               "the evaluation needs at least 11 per kind (CKNNA with evaluate.cknna_k = 10 neighbours)")
    assert data_main(["--params", str(path), "--root", str(tmp_path)]) == 2  # counted again once the images are decoded
    assert "5 test images of kind folders" in capsys.readouterr().err
    assert not (tmp_path / "store" / "data").exists()


def test_missing_root_is_rejected_by_the_schema(tmp_path):
    raw = yaml.safe_load(preset_text("tiny"))
    raw["data"] = {"source": "cub", "root": str(tmp_path / "CUB_200_2011")}
    with pytest.raises(ValueError, match="CUB_200_2011: no such file or directory"):
        validate_params(raw)


def test_pretrained_open_clip_encoder_through_encoder_and_extract_stages(folders, tmp_path):
    config = tmp_path / f"{ARCH}.json"
    config.write_text(json.dumps(CONFIG))
    open_clip.add_model_config(config)
    torch.manual_seed(0)
    model = open_clip.create_model(ARCH)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "tiny.safetensors"))
    params, _ = params_for(folders, tmp_path)
    raw = params.model_dump(mode="json")
    raw["encoder"] = {"kind": "open_clip", "arch": ARCH, "weights": str(tmp_path / "tiny.safetensors"), "arch_config": str(config), "device": "cpu"}
    raw["sweep"]["rotation"]["ks"] = [4]
    params = validate_params(raw)
    layout = Layout(tmp_path)
    data_stage.run(params, layout)
    metrics = encoder_stage.run(params, layout)
    assert metrics["encoder_id"].startswith(f"open_clip:{ARCH}:file-") and metrics["dim"] == 16
    assert set(metrics["zero_shot"]) == {"class"}
    extract_stage.run(params, layout)
    store = open_store(layout.embeddings / "images.zarr")
    assert store.shape == (24, 16) and store.attrs["encoder"] == metrics["encoder_id"]
    np.testing.assert_allclose(np.linalg.norm(store.read(), axis=1), 1.0, atol=1e-5)
    assert open_store(layout.embeddings / "concepts.zarr").shape[1] == 16
    captions = open_store(layout.embeddings / "captions.zarr").read()
    assert captions.shape == (24, 16)
    same = [i for i in range(24) if open_dataset(layout.data).captions[i] == open_dataset(layout.data).captions[0]]
    np.testing.assert_array_equal(captions[same], np.repeat(captions[:1], len(same), axis=0))
