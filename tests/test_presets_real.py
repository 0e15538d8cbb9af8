"""The real-model presets (clip-imagenet, syncub, syncoco) and their offline smoke variants.

The full presets cannot run here (no ImageNet, no hub, no GPU): they must validate and `dvc repro --dry` must list
their whole DAG. Each smoke variant runs the same loader and the same encoder architecture, with random weights from
a local file, on 64 stand-in images written by `cedar smoke NAME`; clip-imagenet-smoke runs end to end under DVC,
syncoco-smoke through the stages in-process, syncub-smoke through the data stage (its own part: the synCUB loader on
the CUB attribute format; every later stage is the path syncoco-smoke runs, with the same ViT-B-16).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from PIL import Image

from cli.main import SMOKE, main
from pipeline.config import validate_params
from pipeline.paths import Layout
from pipeline.presets import preset_text

REAL = ("clip-imagenet", "syncub", "syncoco")


def test_each_smoke_variant_runs_its_presets_loader_and_architecture(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "imagenet" / "train" / "n0").mkdir(parents=True)  # clip-imagenet's root must hold images to validate
    Image.new("RGB", (8, 8)).save(tmp_path / "data" / "imagenet" / "train" / "n0" / "a.png")
    for name in REAL:
        full = validate_params(yaml.safe_load(preset_text(name)))
        raw = yaml.safe_load(preset_text(f"{name}-smoke"))
        writer, folder, arch = SMOKE[name]
        assert raw["data"]["source"] == full.data.source and raw["data"]["root"] == f"smoke/{folder}"
        assert raw["encoder"]["arch"] == full.encoder.arch == arch and raw["encoder"]["weights"] == f"smoke/{arch}-random.safetensors"
        assert raw["train"]["min_steps"] == 0, "a smoke run trains its few steps, not the budget rule's 2,000 (20 minutes of CPU)"
        assert full.d == 512 and full.train.lr == 5e-4, "CLIP ViT-B embeddings; the published SAE learning rate"
    clip = validate_params(yaml.safe_load(preset_text("clip-imagenet")))
    assert set(clip.sweep.sae.dict_sizes) == {4096, 8192, 16384, 32768} and set(clip.sweep.sae.ks) == {16, 32, 64, 128}
    assert clip.encoder.weights == "laion2b_s34b_b79k" and clip.train.precision == "bf16"
    assert {"cedar", "identity", "pca", "ica", "random_rotation"} == set(clip.sweep.rotation.methods)
    assert validate_params(yaml.safe_load(preset_text("syncub"))).data.root == "jokl/syncub"


@pytest.mark.slow
def test_full_presets_validate_and_dry_run_their_whole_dag(tmp_path, monkeypatch):
    """`cedar validate` and `dvc repro --dry` on each full preset in a scratch clone. Every key validates; what
    `cedar validate` still reports here is only what this machine lacks, the pretrained weights (offline, not in the
    hub cache), one line each with the instructions. ImageNet is a stand-in of 4,800 tiny images in class folders, enough
    for every split and for the preset's batches. DVC's dry run stops at the first stage whose dependency is an output not yet made
    (treeverse/dvc#9021, also for the tiny preset), so the stage output folders exist (empty), as after any earlier
    run."""

    from tests.scratch import env, scratch_copy

    repo = scratch_copy(tmp_path)
    monkeypatch.chdir(repo)
    for i in range(4800):  # 4,320 training rows: the preset's SAE batches of 4096 fit (cedar validate checks it)
        folder = repo / "data" / "imagenet" / "train" / f"n{i % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (i, 0, 0)).save(folder / f"{i}.png")
    for folder in ("store/data", "store/encoder", "store/embeddings/images.zarr", "store/captions", "store/probes", "store/metrics", "store/eval"):
        (repo / folder).mkdir(parents=True, exist_ok=True)
    for name in REAL:
        (repo / "params.yaml").write_text(preset_text(name))
        cells = validate_params(yaml.safe_load(preset_text(name))).cells()
        check = subprocess.run([sys.executable, "-m", "cli", "validate"], cwd=repo, env=env(), capture_output=True, text=True)
        assert cells and check.returncode == 2, check.stdout + check.stderr
        lines = check.stderr.removeprefix("error: ").splitlines()
        assert len(lines) == 1 and lines[0].startswith("params.yaml: encoder.weights: ") and "not in the local cache" in lines[0], lines
        dry = subprocess.run([sys.executable, "-m", "dvc", "repro", "--dry"], cwd=repo, env=env(), capture_output=True, text=True, timeout=600)
        assert dry.returncode == 0, dry.stderr[-2000:]
        ran = {line.split("'")[1] for line in dry.stdout.splitlines() if line.startswith("Running stage")}
        expected = {f"{'rotation' if c.rotation else 'sae'}@{c.name}" for c in cells}
        assert expected <= ran and {"data", "encoder", "extract", "captions", "probes", "planted", "report"} <= ran


def smoke_env() -> dict[str, str]:
    from tests.scratch import env

    return {**env(), "OMP_NUM_THREADS": "2"}  # the two cores of the test machine: ViT forward passes dominate


@pytest.mark.slow
def test_clip_imagenet_smoke_runs_end_to_end_under_dvc(tmp_path):
    from tests.scratch import git, scratch_copy

    repo = scratch_copy(tmp_path)
    made = subprocess.run([sys.executable, "-m", "cli", "smoke", "clip-imagenet", "--force"], cwd=repo, env=smoke_env(),
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr[-2000:]
    assert sum(1 for _ in (repo / "smoke" / "imagenet").rglob("*.png")) == 64
    (repo / ".gitignore").write_text("/store/\n/reports/\n.prefect/\n/smoke/\n")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "smoke preset")
    out = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=repo, env=smoke_env(), capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    encoder = json.loads((repo / "store" / "metrics" / "encoder.json").read_text())
    assert encoder["encoder_id"].startswith("open_clip:ViT-B-32:file-") and encoder["dim"] == 512 and encoder["device"] == "cpu"
    metrics = json.loads((repo / "store" / "eval" / "topk-1024-16" / "metrics.json").read_text())
    assert metrics["n_test"] == 16 and metrics["device"] == "cpu" and "folders" in metrics["concepts"]
    assert (repo / "reports" / "index.html").is_file()


@pytest.mark.slow
def test_syncoco_smoke_runs_end_to_end_and_syncub_smoke_loads(tmp_path, monkeypatch):
    import torch

    from stages import captions, cell, data, encoder, extract, probes

    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(2)
    try:
        for name in ("syncub", "syncoco"):
            assert main(["smoke", name, "--params", str(tmp_path / "params.yaml"), "--force"]) == 0
            params = validate_params(yaml.safe_load((tmp_path / "params.yaml").read_text()))
            layout = Layout(tmp_path)
            data.run(params, layout)
            opened = __import__("pipeline.data.dataset", fromlist=["open_dataset"]).open_dataset(layout.data)
            assert opened.kinds == [name] and len(opened.pairs) == 32 and opened.n == 32
            assert sorted(int((opened.split == s).sum()) for s in range(3)) == [4, 12, 16], "the base images are split"
        for stage in (encoder, extract, captions, probes):  # syncoco-smoke, the last one written
            stage.run(params, layout)
        for c in params.cells():
            result = cell.run(params, layout, c)
            assert result["device"] == "cpu" and result["concepts"]["syncoco"]["trained"]["tapas"]["n_pairs"] == 32
    finally:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
