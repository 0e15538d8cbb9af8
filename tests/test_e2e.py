"""End to end on the tiny preset: `dvc repro` in a scratch copy of the repository, then a sweep edit
that must rerun only the new grid cells and the report, an evaluation change that must not retrain, and the
Prefect flow over the same stages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stages.cli import preset_text

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def scratch_copy(tmp: Path) -> Path:
    """The tracked project files (what a clone has) in a fresh git repository, with the tiny preset."""
    repo = tmp / "repo"
    for name in ["pipeline", "stages", "dvc.yaml", ".dvc/config", ".dvcignore", "pyproject.toml"]:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / name)
    (repo / "params.yaml").write_text(preset_text("tiny"))
    (repo / ".gitignore").write_text("/store/\n/reports/\n.prefect/\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "scratch")
    return repo


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True)


def env() -> dict[str, str]:
    """The test's interpreter first on PATH, so dvc's `python -m stages...` runs in this environment."""
    e = dict(os.environ)
    e["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{e['PATH']}"
    e["PYTHONPATH"] = ""  # the scratch copy's own pipeline/ and stages/ (cwd) must win
    e.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    return e


def dvc(repo: Path, *args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, env=env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"dvc {' '.join(args)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def repro(tmp_path_factory) -> Path:
    repo = scratch_copy(tmp_path_factory.mktemp("e2e"))
    dvc(repo, "repro")
    return repo


def test_repro_writes_a_report_with_sane_metrics(repro):
    html = (repro / "reports" / "index.html").read_text()
    assert "FVU against K" in html and "cedar-4" in html and "topk-32-4" in html
    assert "https://" not in html.split("<script>", 1)[0], "the page head must load nothing from the network"
    curve = json.loads((repro / "store" / "eval" / "cedar-4" / "fvu_curve.json").read_text())
    trained = {p["k"]: p["fvu"] for p in curve if p["model"] == "trained"}
    assert trained[16] < 1e-6, "CEDAR at k = d reconstructs exactly"
    ks = sorted(trained)
    assert all(trained[a] >= trained[b] - 1e-9 for a, b in zip(ks, ks[1:])), f"FVU must fall as k grows: {trained}"
    metrics = json.loads((repro / "store" / "eval" / "topk-32-4" / "metrics.json").read_text())
    assert 0 < metrics["trained"]["fvu"] < 1 and metrics["trained"]["l0"] <= 4 + 1e-9
    encoder = json.loads((repro / "store" / "metrics" / "encoder.json").read_text())
    assert encoder["zero_shot_mean"] > encoder["chance_mean"]
    assert 'id="explanations"' in html and 'id="latents"' in html
    for run in ["cedar-4", "topk-32-4"]:
        explained = json.loads((repro / "store" / "eval" / run / "explain.json").read_text())
        assert set(explained["describes"]) == {"objects", "multi"} and "objects" in explained["relevance"]
        assert all(0 <= rates[s] <= 1 for rates in explained["describes"].values() for s in ("dense", "sparse", "topk_original"))
        assert explained["latents"] and all(len(latent["names"]) == 5 for latent in explained["latents"])


def test_adding_a_dictionary_size_reruns_only_the_new_cells_and_the_report(repro):
    assert json.loads(dvc(repro, "status", "--json")) == {}, "a finished repro leaves nothing stale"
    params = yaml.safe_load((repro / "params.yaml").read_text())
    params["sweep"]["sae"]["dict_sizes"].append(64)
    (repro / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    expected = ["report", "sae@topk-64-4"]
    assert sorted(json.loads(dvc(repro, "status", "--json"))) == expected
    before = {p: p.stat().st_mtime_ns for p in (repro / "store").rglob("*") if p.is_file()}
    out = dvc(repro, "repro")
    ran = sorted(line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage"))
    assert ran == expected
    after = {p: p.stat().st_mtime_ns for p in (repro / "store").rglob("*") if p.is_file()}
    touched = {p.relative_to(repro / "store").parts[:2] for p in after if before.get(p) != after[p]}
    assert touched == {("models", "topk-64-4"), ("models", "topk-64-4.codes"), ("eval", "topk-64-4")}


def test_changing_evaluate_params_reevaluates_every_cell_without_retraining(repro):
    dvc(repro, "repro")  # up to date whatever the tests before changed
    cells = sorted(f"{'rotation' if run.startswith('cedar') else 'sae'}@{run}" for run in os.listdir(repro / "store" / "models")
                   if not run.endswith((".tmp", ".final", ".old", ".codes")))
    params = yaml.safe_load((repro / "params.yaml").read_text())
    params["evaluate"]["ks"] = [1, 2, 3, 4, 8, 16]
    (repro / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    models = {p: p.stat().st_mtime_ns for p in (repro / "store" / "models").rglob("*") if p.is_file()}
    result = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=repro, env=env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    ran = sorted(line.split("'")[1] for line in result.stdout.splitlines() if line.startswith("Running stage"))
    assert ran == sorted([*cells, "report"])
    assert {p: p.stat().st_mtime_ns for p in (repro / "store" / "models").rglob("*") if p.is_file()} == models, "no model was retrained"
    assert result.stderr.count("reusing") == len(cells)
    assert result.stderr.count("codes unchanged, reused") == 8 * len(cells), "nor re-encoded: 4 code sets x 2 models per cell"
    curve = json.loads((repro / "store" / "eval" / "cedar-4" / "fvu_curve.json").read_text())
    assert 3 in {p["k"] for p in curve}, "the evaluation used the new params"
    params["train"]["epochs"] += 1  # a training input: that cell retrains
    (repro / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    result = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=repro, env=env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "reusing" not in result.stderr and result.stderr.count("trained in") == len(cells)
