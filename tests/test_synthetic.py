"""The synthetic scale source: what it writes is the planted model it documents, block by block, and the pipeline's
training/evaluation half runs on it through the stages (data -> encoder -> extract -> captions -> cell)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import yaml

from pipeline.config import ParamsError, validate_params
from pipeline.data import synthetic
from pipeline.data.dataset import open_dataset
from pipeline.data.options import SyntheticSettings
from pipeline.paths import Layout
from pipeline.presets import preset_text
from pipeline.store import open_store


def write(tmp_path, seed: int = 0, **overrides):
    settings = SyntheticSettings(**{"source": "synthetic", "n": 300, "d": 12, "families": 3, "values": 4, "noise": 0.0, "n_pairs": 20,
                                    "split": (0.6, 0.2, 0.2), **overrides})
    root = tmp_path / f"data-{seed}-{len(overrides)}"
    synthetic.write_synthetic(root, settings, seed, {"test": True})
    return settings, root, open_dataset(root)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """n = 300 in blocks of 64 rows (several blocks and a short last one), no noise: every number is checkable."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(synthetic, "BLOCK_ROWS", 64)
        return write(tmp_path_factory.mktemp("synthetic"))


def test_labels_are_one_hot_families_and_captions_name_them(small):
    settings, root, data = small
    labels = data.attributes
    assert labels.shape == (300, 12) and data.kinds == ["synthetic"] and data.one_hot("synthetic")
    for columns in data.families("synthetic").values():
        assert (labels[:, columns].sum(axis=1) == 1).all()
    assert data.attribute_names[:5] == ["f0v0", "f0v1", "f0v2", "f0v3", "f1v0"]
    rows = np.array([0, 63, 64, 299])
    for caption, row in zip(data.caption_rows(rows), labels[rows]):
        assert caption.split() == [data.attribute_names[j] for j in np.flatnonzero(row)]
    assert not data.has_images and data.has_embeddings
    split = data.split
    assert [(split == s).sum() for s in range(3)] == [180, 60, 60]


def test_embeddings_are_planted_sparse_combinations_of_the_concept_directions(small):
    """Without noise, x - offset is exactly sum_f m_f D[f, v_f] with m_f in [0.5, 1.5] (least squares on the active
    concepts recovers the magnitudes with a zero residual)."""
    settings, root, data = small
    x = open_store(root / "embeddings" / "images.zarr").read()
    concepts = open_store(root / "embeddings" / "concepts.zarr")
    assert concepts.attrs["texts"] == data.attribute_names
    directions = concepts.read()
    np.testing.assert_allclose(np.linalg.norm(directions, axis=1), 1.0, rtol=1e-6)
    offset = synthetic.directions(settings, 0)[1] * settings.offset
    labels = data.attributes
    for row in (0, 100, 299):
        active = np.flatnonzero(labels[row])
        m, residual, *_ = np.linalg.lstsq(directions[active].T, x[row] - offset, rcond=None)
        assert ((m >= 0.5 - 1e-5) & (m <= 1.5 + 1e-5)).all() and residual.sum() < 1e-8


def test_pairs_swap_one_family_value_of_a_test_row(small):
    settings, root, data = small
    pairs = data.pairs
    x = open_store(root / "embeddings" / "images.zarr")
    before = open_store(root / "embeddings" / "pairs_before.zarr").read()
    after = open_store(root / "embeddings" / "pairs_after.zarr").read()
    directions = open_store(root / "embeddings" / "concepts.zarr").read()
    assert len(pairs) == 20 and (data.split[pairs.base_index] == 2).all() and pairs.before is None
    np.testing.assert_array_equal(before, x.take(pairs.base_index))
    np.testing.assert_array_equal(pairs.before_attributes, data.attributes[pairs.base_index])
    changed = pairs.before_attributes != pairs.after_attributes
    assert (changed.sum(axis=1) == 2).all()
    assert pairs.before_attributes[np.arange(20), pairs.removed].all() and pairs.after_attributes[np.arange(20), pairs.added].all()
    assert (pairs.removed // 4 == pairs.added // 4).all(), "a value of the same family"
    step = after - before  # = m (D[added] - D[removed]) with the row's magnitude m of that family
    m = np.sum(step * (directions[pairs.added] - directions[pairs.removed]), axis=1) / np.sum((directions[pairs.added] - directions[pairs.removed]) ** 2, axis=1)
    np.testing.assert_allclose(step, m[:, None] * (directions[pairs.added] - directions[pairs.removed]), atol=1e-5)
    assert ((m > 0.5 - 1e-4) & (m < 1.5 + 1e-4)).all()


def test_same_settings_and_seed_write_the_same_data_and_another_seed_does_not(tmp_path):
    _, a, _ = write(tmp_path, seed=1)
    _, b, _ = write(tmp_path, seed=1, noise=0.0)  # same values, another folder
    _, c, _ = write(tmp_path, seed=2)
    read = lambda root: open_store(root / "embeddings" / "images.zarr").read()  # noqa: E731
    np.testing.assert_array_equal(read(a), read(b))
    assert not np.array_equal(read(a), read(c))


def test_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="n_pairs=50 > about 20 test rows"):
        SyntheticSettings(source="synthetic", n=200, n_pairs=50)
    raw = yaml.safe_load(preset_text("synthetic-tiny"))
    params = validate_params(raw)
    assert params.d == 16, "d comes from the synthetic source (no encoder)"
    raw["sweep"]["rotation"]["ks"] = [17]
    with pytest.raises(ParamsError, match=r"sweep.rotation.ks\[0\]: k=17 must be in 1..d=16"):
        validate_params(raw)
    raw = yaml.safe_load(preset_text("synthetic-tiny"))
    raw["data"]["famlies"] = 3
    with pytest.raises(ParamsError, match="data.famlies: unknown key"):
        validate_params(raw)


@pytest.mark.slow
def test_synthetic_source_round_trips_through_the_stages(tmp_path):
    """data -> encoder (none) -> extract (links) -> captions -> both grid cells -> planted -> report, in-process."""
    from stages import captions, cell, data, encoder, extract, planted, probes, report

    (tmp_path / "params.yaml").write_text(preset_text("synthetic-tiny"))
    params = validate_params(yaml.safe_load(preset_text("synthetic-tiny")))
    layout = Layout(tmp_path)
    data.run(params, layout)
    metrics = encoder.run(params, layout)
    assert metrics["device"] == "none" and metrics["dim"] == 16 and metrics["zero_shot"] == {}
    extract.run(params, layout)
    linked = layout.image_embeddings / "zarr.json"
    assert os.stat(linked).st_ino == os.stat(layout.data_embeddings / "images.zarr" / "zarr.json").st_ino, "linked, not copied"
    assert len(open_store(layout.image_embeddings)) == 600
    captions.run(params, layout)
    probes.run(params, layout)
    for c in params.cells():
        result = cell.run(params, layout, c)
        assert result["device"] == "cpu" and result["n_test"] == 120
        trained = result["concepts"]["synthetic"]["trained"]
        assert 0 < result["trained"]["fvu"] < 1 and trained["tapas"]["n_pairs"] == 40 and trained["probe"] is not None
        assert 0 <= trained["match_strongest"] <= 1 and isinstance(result["concepts"]["synthetic"]["delta_match_strongest"], float)
        assert (layout.codes(c.name) / "trained" / "test" / "meta.json").is_file()
    planted.run(params, layout)
    html = report.run(params, layout, (tmp_path / "params.yaml").read_text())
    assert "cedar-4" in html and "topk-32-4" in html
    planted_rows = json.loads(layout.planted_metrics.read_text())
    section = html[html.index('<section id="planted">'):]
    section = section[: section.index("</section>")]
    assert planted_rows
    for r in planted_rows:  # every fitted method with its FVU over the oracle's, as the benchmark computed it
        assert f'<td class="l">{r["method"]}</td>' in section and f"{r['fvu_ratio']:.2f}x" in section


@pytest.mark.slow
def test_dvc_repro_runs_the_synthetic_preset_end_to_end(tmp_path):
    """`dvc repro` on the synthetic tiny preset in a scratch clone: every stage runs, nothing is stale afterwards."""
    import json

    from tests.scratch import dvc, git, scratch_copy

    repo = scratch_copy(tmp_path)
    (repo / "params.yaml").write_text(preset_text("synthetic-tiny"))
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "synthetic preset")
    out = dvc(repo, "repro")
    ran = sorted(line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage"))
    assert ran == ["captions", "data", "encoder", "extract", "planted", "probes", "report", "rotation@cedar-4", "sae@topk-32-4"]
    assert json.loads(dvc(repo, "status", "--json")) == {}
    metrics = json.loads((repo / "store" / "eval" / "topk-32-4" / "metrics.json").read_text())
    assert metrics["concepts"]["synthetic"]["trained"]["match_score"] > 0 and metrics["device"] == "cpu"
    assert json.loads((repo / "store" / "metrics" / "encoder.json").read_text())["device"] == "none"
