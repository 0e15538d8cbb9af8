"""End to end on the tiny preset: `dvc repro` in a scratch copy of the repository, then a sweep edit
that must rerun only the new grid cells and the report, and an evaluation change that must not retrain
(`cedar flow` over the same stages: tests/test_flow.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.scratch import copy_repo, dvc, run_dvc

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def repro(tiny_repro, tmp_path_factory) -> Path:
    """A copy of the session's finished tiny `dvc repro` (these tests change its params)."""
    return copy_repo(tiny_repro, tmp_path_factory.mktemp("e2e") / "repo")


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
    tapas = metrics["concepts"]["objects"]["trained"]["tapas"]
    assert sum(f["n_pairs"] for f in tapas["families"].values()) == tapas["n_pairs"], "every pair counts in its edited family"
    assert "TAPAScore per edited family" in html
    timings = json.loads((repro / "store" / "timings" / "topk-32-4.json").read_text())
    assert set(timings) == {"encode", "fvu", "cknna", "probes", "fms", "matching", "tapas", "explain", "total"}
    assert all(v >= 0 for v in timings.values()) and sum(v for k, v in timings.items() if k != "total") <= timings["total"]
    assert "timings" in dvc(repro, "metrics", "show"), "`dvc metrics show` lists where each cell's time went"
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
    assert touched == {("models", "topk-64-4"), ("models", "topk-64-4.codes"), ("models", "topk-64-4.timings.json"), ("eval", "topk-64-4"),
                       ("timings", "topk-64-4.json")}


def test_changing_evaluate_params_reevaluates_every_cell_without_retraining(repro):
    dvc(repro, "repro")  # up to date whatever the tests before changed
    cells = sorted(f"{'rotation' if run.startswith('cedar') else 'sae'}@{run}" for run in os.listdir(repro / "store" / "models")
                   if not run.endswith((".tmp", ".final", ".old", ".codes", ".timings.json")))
    params = yaml.safe_load((repro / "params.yaml").read_text())
    params["evaluate"]["ks"] = [1, 2, 3, 4, 8, 16]
    (repro / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    models = {p: p.stat().st_mtime_ns for p in (repro / "store" / "models").rglob("*") if p.is_file()}
    result = run_dvc(repro, "repro")
    assert result.returncode == 0, result.stderr[-4000:]
    ran = sorted(line.split("'")[1] for line in result.stdout.splitlines() if line.startswith("Running stage"))
    # the probes stage reads the whole evaluate section (a key a preset leaves out would be a DVC error): it refits,
    # writes the same bytes, and the cells keep their code sets
    assert ran == sorted([*cells, "probes", "report"])
    assert {p: p.stat().st_mtime_ns for p in (repro / "store" / "models").rglob("*") if p.is_file()} == models, "no model was retrained"
    assert result.stderr.count("reusing") == len(cells)
    assert result.stderr.count("codes unchanged, reused") == 8 * len(cells), "nor re-encoded: 4 code sets x 2 models per cell"
    curve = json.loads((repro / "store" / "eval" / "cedar-4" / "fvu_curve.json").read_text())
    assert 3 in {p["k"] for p in curve}, "the evaluation used the new params"
    params["train"]["epochs"] += 1  # a training input: that cell retrains
    (repro / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    result = run_dvc(repro, "repro")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "reusing" not in result.stderr and result.stderr.count("trained in") == len(cells)
