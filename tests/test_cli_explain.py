"""The `cedar explain` command: choosing the run, one-line errors, and explaining an image for every encoder kind."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cli.main import choose_run, main
from pipeline.config import ParamsError, validate_params
from pipeline.explain.options import DecoderSettings, ExplainSettings
from pipeline.presets import preset_text
from pipeline.training.options import TrainSettings


def metrics(run: str, method: str, objects: float | None, multi: float = 0.0) -> dict:
    concepts = {"multi": {"trained": {"match_score": multi}}}
    if objects is not None:
        concepts = {"objects": {"trained": {"match_score": objects}}, **concepts}
    return {"run": run, "method": method, "concepts": concepts}


def test_explain_and_captions_params_are_the_components_settings() -> None:
    import yaml

    raw = yaml.safe_load(preset_text("tiny"))
    params = validate_params(raw)
    assert isinstance(params.explain, ExplainSettings) and params.explain.caption_ks == (1, 2, 4, 8, 16)
    assert isinstance(params.captions, DecoderSettings) and params.captions.width == 64
    assert params.captions.train.epochs == 15 and params.captions.train.weight_decay == 0.01  # unlisted: the decoder's own default
    raw["captions"] = {"width": 30, "heads": 4}
    raw["explain"] = {"top_m": 0}
    with pytest.raises(ParamsError) as error:
        validate_params(raw)
    assert "captions: width (30) must be divisible by heads (4)" in str(error.value)
    assert "explain.top_m" in str(error.value)


def test_choose_run_names_the_known_runs_or_takes_the_best() -> None:
    names = ["cedar-4", "topk-32-4"]
    assert choose_run(names, [metrics("cedar-4", "cedar", 0.3), metrics("topk-32-4", "topk", 0.5)], None) == "topk-32-4"
    assert choose_run(names, [], "cedar-4") == "cedar-4"
    with pytest.raises(ValueError, match="unknown run 'nope'; known runs: cedar-4, topk-32-4"):
        choose_run(names, [], "nope")
    with pytest.raises(FileNotFoundError, match="no evaluated run"):
        choose_run(names, [], None)


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    """A project root with the tiny params and a dataset stub (only the image size is read before the checks)."""
    (tmp_path / "params.yaml").write_text(preset_text("tiny"))
    (tmp_path / "store" / "data").mkdir(parents=True)
    (tmp_path / "store" / "data" / "meta.json").write_text(json.dumps({"image_size": 32, "kinds": {}}))
    return tmp_path


def run_cli(project: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["explain", *args, "--params", str(project / "params.yaml"), "--root", str(project)])
    return code, capsys.readouterr().err.strip()


def test_cli_explain_unknown_run_lists_the_known_ones(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(project, capsys, str(project / "x.png"), "--run", "nope")
    assert code == 2 and err == "error: unknown run 'nope'; known runs: cedar-4, topk-32-4"


def test_cli_explain_unreadable_image_is_one_line(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = project / "bad.png"
    bad.write_text("not an image")
    code, err = run_cli(project, capsys, str(bad), "--run", "cedar-4")
    assert code == 2 and err.startswith(f"error: {bad}: unreadable image (") and "\n" not in err
    code, err = run_cli(project, capsys, str(project / "missing.png"), "--run", "cedar-4")
    assert code == 2 and err == f"error: {project / 'missing.png'}: unreadable image (file not found)"


def test_cli_explain_on_a_dataset_without_images_says_why(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "store" / "data" / "meta.json").write_text(json.dumps({"image_size": None, "images": False, "kinds": {}}))
    code, err = run_cli(project, capsys, str(project / "x.png"), "--run", "cedar-4")
    assert code == 2 and err.startswith("error: ") and "the dataset has no images" in err and "\n" not in err


def test_cli_explain_without_evaluated_runs_says_what_to_do(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(project, capsys, str(project / "x.png"))
    assert code == 2 and "no evaluated run under store/eval" in err


# --- explaining an image under a run trained on any encoder kind -----------------------------------------------
OPEN_CLIP_ARCH = "tiny-vit-explain"
OPEN_CLIP_CONFIG = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


def open_clip_project(root: Path) -> Path:
    """A project whose encoder stage recorded a randomly initialised open_clip model saved to a local file, with a
    CEDAR run, a caption decoder and a concept vocabulary embedded by that encoder; returns an image to explain."""
    import numpy as np
    import open_clip
    import torch
    from PIL import Image
    from safetensors.torch import save_file

    from pipeline.encoders.options import PretrainedSettings
    from pipeline.encoders.registry import load_encoder, save_spec
    from pipeline.explain.decoder import save_decoder, train_decoder
    from pipeline.models.checkpoint import save_model
    from pipeline.models.registry import build
    from pipeline.paths import Layout
    from pipeline.store import write_array

    layout = Layout(root)
    (root / "params.yaml").write_text(preset_text("tiny"))
    config = root / f"{OPEN_CLIP_ARCH}.json"
    config.write_text(json.dumps(OPEN_CLIP_CONFIG))
    open_clip.add_model_config(config)
    torch.manual_seed(0)
    state = {k: v.contiguous() for k, v in open_clip.create_model(OPEN_CLIP_ARCH).state_dict().items()}
    save_file(state, str(root / "weights.safetensors"))
    spec = PretrainedSettings(kind="open_clip", arch=OPEN_CLIP_ARCH, weights=str(root / "weights.safetensors"), arch_config=str(config), device="cpu")
    encoder = load_encoder(spec)
    save_spec(spec, layout.encoder, encoder)
    layout.data.mkdir(parents=True)
    (layout.data / "meta.json").write_text(json.dumps({"image_size": 32, "kinds": {}}))
    images = np.random.default_rng(0).integers(0, 256, (24, 32, 32, 3), dtype=np.uint8)
    x = encoder.encode_images(images)
    model = build("cedar", 16, 16, 4, seed=0)
    model.fit_init(torch.as_tensor(x))
    save_model(model, layout.model("cedar-4"))
    decoder, _ = train_decoder(x, [f"a {c} thing" for c in ["red", "blue", "green"] * 8],
                               DecoderSettings(width=16, heads=2, layers=1, train=TrainSettings(epochs=2, min_steps=0, batch_size=8)), seed=0)
    save_decoder(decoder, layout.captions)
    texts = ["red", "blue", "green", "thing"]
    write_array(layout.concept_embeddings, encoder.encode_texts(texts), fingerprint={"test": True}, attrs={"texts": texts})
    image = root / "image.png"
    Image.fromarray(images[0]).save(image)
    return image


def test_cli_explain_goes_through_the_encoder_registry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    image = open_clip_project(tmp_path)
    code = main(["explain", str(image), "--run", "cedar-4", "--top", "2", "--params", str(tmp_path / "params.yaml"), "--root", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "run cedar-4 · k = 4" in out
    assert "top concepts (latent, activation, its best concept and cosine):" in out
    listed = [m.group(1) for line in out.splitlines() if (m := re.match(r"\s+[+-]\d+\s+\d+\.\d{3}\s+(\w+) \(", line))]
    assert len(listed) == 2 and set(listed) <= {"red", "blue", "green", "thing"}
    assert "caption (sparse reconstruction, k = 4): " in out and "caption (dense embedding): " in out


def test_cli_runs_lists_each_runs_numbers_and_its_training_and_evaluation_seconds(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.config import load_params
    from pipeline.paths import Layout

    layout, cells = Layout(project), load_params(project / "params.yaml").cells()
    timed, untimed = cells[0].name, cells[1].name
    for name in (timed, untimed):  # two evaluated runs: one with timings files, one without
        layout.run_metrics(name).parent.mkdir(parents=True, exist_ok=True)
        layout.run_metrics(name).write_text(json.dumps({"size": 16, "k": 4, "trained": {"fvu": 0.25, "l0": 4.0, "dead_fraction": 0.125}}))
    layout.model_timings(timed).parent.mkdir(parents=True, exist_ok=True)
    layout.model_timings(timed).write_text(json.dumps({"seconds": {"steps": 10.0, "total": 12.34}}))
    layout.run_timings(timed).parent.mkdir(parents=True, exist_ok=True)
    layout.run_timings(timed).write_text(json.dumps({"fms": 1.0, "total": 56.78}))
    assert main(["runs", "--params", str(project / "params.yaml"), "--root", str(project)]) == 0
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    assert lines["run"][-2:] == ["train", "evaluate"]
    assert lines[timed][1:] == ["16", "4", "0.2500", "4.00", "0.125", "12.3s", "56.8s"]
    assert lines[untimed][-2:] == ["-", "-"], "a run without timings files says so"
    layout.run_metrics(untimed).unlink()
    main(["runs", "--params", str(project / "params.yaml"), "--root", str(project)])
    assert "(not evaluated)" in next(line for line in capsys.readouterr().out.splitlines() if line.startswith(untimed))
