"""pipeline.training.feed and the training stage's two feed modes: the plan (which mode, what it refuses), the
one-pass reading, the batches each mode draws (the same on every device, documented orders), and the stage in each
mode: byte-identical reruns, an exact resume after a kill, the fingerprint and the timings beside the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from pipeline.config import validate_params
from pipeline.paths import Layout
from pipeline.store import Store, open_store, write_array
from pipeline.training.feed import FeedPlan, in_background, load_rows, plan_feed, streaming_batches, streaming_bytes
from pipeline.training.loop import array_batches
from pipeline.training.options import BATCHES_IN_FLIGHT, TrainSettings

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[1]
DEVICES = [CPU] + ([torch.device("cuda")] if torch.cuda.is_available() else [])


def rows_store(tmp_path: Path, n: int = 1000, d: int = 4, chunk_rows: int = 64) -> tuple[Store, np.ndarray]:
    """A float32 store whose row i starts with i (so a batch tells which rows it holds)."""
    x = np.random.default_rng(0).normal(size=(n, d)).astype(np.float32)
    x[:, 0] = np.arange(n)
    return write_array(tmp_path / "x.zarr", x, fingerprint={"test": 1}, chunk_rows=chunk_rows), x


def preset(name: str) -> dict:
    return yaml.safe_load((ROOT / "pipeline" / "presets" / f"{name}.yaml").read_text())


# --- the plan ------------------------------------------------------------------------------------------------------


def test_the_plan_is_resident_when_the_split_fits_the_budget_and_streaming_otherwise():
    settings = TrainSettings(batch_size=100, shuffle_rows=1000)
    fits = plan_feed(settings, n_rows=10_000, row_bytes=40, chunk_rows=64, device=CPU, free=1_000_000)  # 400 kB of 500 kB
    assert fits.mode == "resident" and fits.budget == 500_000 and fits.identity == {"mode": "resident"}
    small = plan_feed(settings, n_rows=20_000, row_bytes=40, chunk_rows=64, device=CPU, free=1_000_000)  # 800 kB > 500 kB
    assert small.mode == "streaming" and small.window_chunks == 16 and small.identity == {"mode": "streaming", "window_chunks": 16}
    assert small.needed == streaming_bytes(16 * 64, 100, 40) <= small.budget
    sized = plan_feed(TrainSettings(batch_size=100, feed_memory="1MiB"), n_rows=20_000, row_bytes=40, chunk_rows=64, device=CPU, free=1)
    assert sized.mode == "resident" and sized.budget == 2**20, "a size is a size, whatever is free"
    asked = plan_feed(TrainSettings(batch_size=100, feed="streaming", shuffle_rows=100), n_rows=100, row_bytes=40, chunk_rows=64, device=CPU,
                      free=10**9)
    assert asked.mode == "streaming" and asked.window_chunks == 2


@pytest.mark.parametrize("settings, n_rows, message", [
    (TrainSettings(batch_size=500), 400, r"train.batch_size: 500 rows per step, but the training split has only 400 rows"),
    (TrainSettings(batch_size=100, feed_memory="1KiB"), 400, r"train.batch_size: 6 batches in flight of 100 rows of 40 bytes do not fit "
                                                              r"train.feed_memory = 1KiB"),
    (TrainSettings(batch_size=10, feed="resident", feed_memory="10KiB"), 1000, r"train.feed: resident needs the training split in memory"),
    (TrainSettings(batch_size=10, feed_memory="40KiB", shuffle_rows=5000), 10_000, r"train.shuffle_rows: streaming windows of 5056 rows"),
])
def test_the_plan_refuses_what_the_data_or_the_budget_cannot_hold_naming_the_setting(settings, n_rows, message):
    with pytest.raises(ValueError, match=message):
        plan_feed(settings, n_rows=n_rows, row_bytes=40, chunk_rows=64, device=CPU, free=10**9)


def test_validate_refuses_batches_the_data_or_a_sized_budget_cannot_hold():
    from pipeline.config import ParamsError, load_params

    raw = preset("synthetic-tiny")  # 600 rows, 360 of them training rows, d = 16
    with pytest.raises(ValueError, match=r"train.batch_size: 400 rows per step, but the training split has only 360 rows .*\(training cedar, topk\)"):
        validate_params({**raw, "train": {**raw["train"], "batch_size": 400}})
    with pytest.raises(ValueError, match=r"methods.topk.train.batch_size: 6 batches in flight of 64 rows of d = 16 float32 values need 24.0 KiB, "
                                         r"more than train.feed_memory = 20KiB allows"):
        validate_params({**raw, "methods": {**raw["methods"], "topk": {"train": {"batch_size": 64, "feed_memory": "20KiB"}}}})
    fixed = {**raw, "sweep": {**raw["sweep"], "rotation": {"methods": ["pca"], "ks": [4]}, "sae": {**raw["sweep"]["sae"], "methods": ["topk"]}},
             "methods": {"pca": {"train": {"batch_size": 10_000}}, "topk": {}}}
    validate_params(fixed)  # a fixed basis makes no steps: its batch size is not checked
    assert ParamsError and load_params  # the same schema every stage and `cedar validate` load


def test_validate_checks_a_fraction_of_free_memory_on_this_machine(monkeypatch):
    from pipeline import resources

    raw = preset("synthetic-tiny")
    params = validate_params({**raw, "train": {**raw["train"], "device": "cpu", "feed_memory": 0.5}})
    assert resources.resource_problems(params) == []
    monkeypatch.setattr("pipeline.resources.host_memory", lambda: 10_000)  # 5,000 bytes < 6 x 64 x 16 x 4
    (problem,) = resources.resource_problems(params)
    assert problem.startswith("params.yaml: train.batch_size: 6 batches in flight of 64 rows of d = 16") and "(4.9 KiB)" in problem


# --- reading -------------------------------------------------------------------------------------------------------


def test_load_rows_reads_the_parts_in_one_pass_over_their_chunks(tmp_path, monkeypatch):
    store, x = rows_store(tmp_path, n=1000, chunk_rows=64)
    reads: list[tuple[int, int]] = []
    original = Store.read
    monkeypatch.setattr(Store, "read", lambda self, start=0, stop=None: reads.append((start, stop)) or original(self, start, stop))
    train = np.sort(np.random.default_rng(1).choice(1000, 600, replace=False))
    val = np.array([3, 70, 999])
    out = load_rows(store, {"train": train, "val": val}, CPU, threads=3)
    np.testing.assert_array_equal(out["train"].numpy(), x[train])
    np.testing.assert_array_equal(out["val"].numpy(), x[val])
    chunks = [c for start, stop in reads for c in range(start // 64, -(-stop // 64))]
    assert sorted(chunks) == list(range(16)), "every chunk read once"
    reads.clear()
    load_rows(store, {"val": val}, CPU)
    assert sorted(reads) == [(0, 128), (960, 1000)], "only the chunks the rows are in, consecutive ones together"
    with pytest.raises(ValueError, match="val: row ids must be sorted"):
        load_rows(store, {"val": np.array([5, 3])}, CPU)


# --- the batches of each mode ---------------------------------------------------------------------------------------


def epoch_rows(batches) -> list[np.ndarray]:
    return [np.asarray(b.cpu() if isinstance(b, torch.Tensor) else b)[:, 0].astype(np.int64) for b in batches]


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_resident_batches_are_a_full_permutation_per_epoch_the_same_on_every_device(device):
    x = np.random.default_rng(0).normal(size=(103, 3)).astype(np.float32)
    x[:, 0] = np.arange(103)
    host = array_batches(x, 10, seed=5)
    on_device = array_batches(torch.from_numpy(x).to(device), 10, seed=5)
    for epoch in range(3):
        expected = epoch_rows(host(epoch))
        got = list(on_device(epoch))
        assert all(b.device.type == device.type for b in got), "batches are gathered on the device"
        assert [list(r) for r in epoch_rows(got)] == [list(r) for r in expected]
        order = np.concatenate(expected)
        assert sorted(order) == list(range(103)) and [len(r) for r in expected] == [10] * 10 + [3]
        permutation = np.random.default_rng([5, epoch]).permutation(103)  # the documented order: batches of it, rows ascending
        assert [list(r) for r in expected] == [sorted(permutation[i : i + 10]) for i in range(0, 103, 10)]
    assert not np.array_equal(np.concatenate(epoch_rows(host(0))), np.concatenate(epoch_rows(host(1))))


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_streaming_batches_are_the_stores_window_shuffle_with_any_thread_count_on_every_device(tmp_path, device):
    store, _ = rows_store(tmp_path, n=1000, chunk_rows=64)
    train = np.flatnonzero(np.random.default_rng(2).random(1000) < 0.8)
    reference = store.shuffled_batches(50, seed=3, rows=train, buffer_chunks=3, threads=1)
    for threads in (1, 4):
        source = streaming_batches(store, train, 50, seed=3, window_chunks=3, device=device, threads=threads)
        for epoch in range(2):
            got = list(source(epoch))
            assert all(b.device.type == "cpu" and b.dtype == torch.float32 for b in got), "host batches; the loop copies them"
            assert all(b.is_pinned() for b in got) == (device.type == "cuda"), "page-locked for a GPU"
            expected = epoch_rows(reference(epoch))
            assert [list(r) for r in epoch_rows(got)] == [list(r) for r in expected]
            assert sorted(np.concatenate(expected)) == list(train), "every training row once per epoch"
    # the documented difference: streaming is not resident's full permutation
    resident = np.concatenate(epoch_rows(array_batches(np.asarray(store.take(train)), 50, seed=3)(0)))
    assert not np.array_equal(np.concatenate(epoch_rows(reference(0))), resident)


def test_streaming_windows_bound_how_far_a_row_moves(tmp_path):
    """Within an epoch, rows meet only rows of their window: the first batch comes from the first window's chunks."""
    store, _ = rows_store(tmp_path, n=1000, chunk_rows=64)
    first = epoch_rows(store.shuffled_batches(32, seed=0, buffer_chunks=2)(0))[0]
    order = np.random.default_rng([0, 0]).permutation(16)
    assert set(first // 64) <= set(order[:2])


def test_the_background_reader_raises_the_readers_error_and_stops_when_abandoned():
    def failing():
        yield np.zeros((2, 2), np.float32)
        raise OSError("chunk c/3/0 is damaged")

    batches = in_background(failing(), CPU)
    assert next(batches).shape == (2, 2)
    with pytest.raises(OSError, match="chunk c/3/0 is damaged"):
        next(batches)
    produced = []

    def endless():
        while True:
            produced.append(1)
            yield np.zeros((1, 1), np.float32)

    batches = in_background(endless(), CPU, depth=2)
    next(batches)
    batches.close()  # the loop stops mid-epoch at its step budget
    count = len(produced)
    import time

    time.sleep(0.2)
    assert len(produced) == count <= 5, "the producer stopped"


# --- the stage in each mode ------------------------------------------------------------------------------------------


def project(root: Path, **train) -> tuple:
    """A synthetic project (60,000 rows of d = 64: eight chunks of 8,192 rows (2 MiB); 48,000 training rows, 11.7 MiB)
    with a CEDAR and a TopK cell; data and extract run once."""
    from stages import data, extract

    params = {
        "seed": 0,
        "data": {"source": "synthetic", "n": 60_000, "d": 64, "families": 4, "values": 4, "n_pairs": 20, "split": [0.8, 0.1, 0.1]},
        "train": {"batch_size": 512, "epochs": 3, "min_steps": 0, "lr": 0.003, "val_samples": 500, "init_samples": 1000, **train},
        "sweep": {"rotation": {"methods": ["cedar"], "ks": [4]}, "sae": {"methods": ["topk"], "dict_sizes": [32], "ks": [4]}},
        "methods": {"cedar": {}, "topk": {}},
        "evaluate": {"ks": [4]},
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    p, layout = validate_params(params), Layout(root)
    if not layout.image_embeddings.exists():
        data.run(p, layout)
        extract.run(p, layout)
    return p, layout


def outputs(layout: Layout, run: str) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(layout.model(run).iterdir())}


@pytest.fixture(scope="module")
def stage_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("feed_stage")
    project(root)
    return root


@pytest.mark.parametrize("feed", ["resident", "streaming"])
def test_the_stage_in_each_mode_reruns_byte_identically_and_resumes_exactly_after_a_kill(stage_root, feed, monkeypatch):
    from pipeline.training import resume
    from pipeline.training.cell_training import train_cell

    p, layout = project(stage_root, feed=feed, shuffle_rows=5000)
    cell = p.cells()[-1]  # the TopK SAE: 94 steps an epoch, 3 epochs
    train_cell(p, layout, cell)
    first = outputs(layout, cell.name)
    timings = json.loads(layout.model_timings(cell.name).read_text())
    assert timings["feed"] == feed and timings["steps"] == 282
    assert {"process_start", "open", "device", "read", "init", "steps", "validation", "checkpoint", "save", "total"} <= set(timings["seconds"])
    assert "seconds" not in json.loads(first["history.json"]) and layout.model_timings(cell.name).parent != layout.model(cell.name)

    def rerun() -> dict[str, bytes]:
        import shutil

        shutil.rmtree(layout.model(cell.name))
        train_cell(p, layout, cell)
        return outputs(layout, cell.name)

    assert rerun() == first, "the same inputs train a byte-identical model"
    # a kill right after the checkpoint of epoch 2 is on disk
    saves = []
    original = resume.Checkpoints.save

    def save_then_die(self, *args):
        original(self, *args)
        saves.append(1)
        if len(saves) == 2:
            self.close()
            raise KeyboardInterrupt

    import shutil

    shutil.rmtree(layout.model(cell.name))
    monkeypatch.setattr(resume.Checkpoints, "save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train_cell(p, layout, cell)
    monkeypatch.setattr(resume.Checkpoints, "save", original)
    assert json.loads((layout.model_work(cell.name) / "resume.json").read_text())["state"]["epoch"] == 2
    train_cell(p, layout, cell)
    assert outputs(layout, cell.name) == first, "the resumed run equals the uninterrupted one"
    assert json.loads(layout.model_timings(cell.name).read_text())["steps"] == 94, "it made only the last epoch's steps"


def test_the_two_modes_draw_different_batches_and_are_fingerprinted_apart(stage_root):
    from pipeline.training.cell_training import train_cell

    trained = {}
    for feed in ("resident", "streaming"):
        p, layout = project(stage_root, feed=feed, shuffle_rows=5000)  # one chunk a window
        cell = p.cells()[-1]
        train_cell(p, layout, cell)
        trained[feed] = outputs(layout, cell.name)
    configs = {feed: json.loads(files["config.json"])["provenance"]["fingerprint"] for feed, files in trained.items()}
    assert configs["resident"] != configs["streaming"]
    assert trained["resident"]["model.safetensors"] != trained["streaming"]["model.safetensors"]


def test_auto_streams_when_the_split_exceeds_the_budget_and_a_fixed_basis_reads_no_split(stage_root, caplog):
    from pipeline.training.cell_training import train_cell

    p, layout = project(stage_root, feed="auto", feed_memory="12MiB", shuffle_rows=5000)  # the split, 11.7 MiB, fits
    cell = p.cells()[-1]
    train_cell(p, layout, cell)
    assert json.loads(layout.model_timings(cell.name).read_text())["feed"] == "resident"
    p, layout = project(stage_root, feed="auto", feed_memory="10MiB", shuffle_rows=5000)  # it does not; streaming: 7 MiB
    with caplog.at_level("INFO", logger="pipeline.training.cell_training"):
        train_cell(p, layout, cell)
    assert json.loads(layout.model_timings(cell.name).read_text())["feed"] == "streaming"
    assert "topk-32-4: streaming (the training split (12 MiB) exceeds 10MiB): windows of 1 chunks, at most 7 MiB" in caplog.text
    p, layout = project(stage_root, feed="auto", feed_memory="6MiB", shuffle_rows=5000)  # a window is a chunk at least
    with pytest.raises(ValueError, match="train.shuffle_rows: streaming windows of 8192 rows and batches of 512 need 7 MiB, more than "
                                         "train.feed_memory = 6MiB"):
        train_cell(p, layout, cell)
    pca = validate_params({**yaml.safe_load((stage_root / "params.yaml").read_text()),
                           "sweep": {"rotation": {"methods": ["pca"], "ks": [4]}, "sae": {"methods": ["topk"], "dict_sizes": [32], "ks": [4]}},
                           "methods": {"pca": {}, "topk": {}}, "train": {"batch_size": 512, "feed": "resident", "feed_memory": "1MiB"}})
    train_cell(pca, layout, pca.cells()[0])  # no steps: the resident split need not fit
    assert json.loads(layout.model_timings(pca.cells()[0].name).read_text())["feed"] == "none"


def test_the_stage_refuses_a_batch_larger_than_the_training_split_before_reading(stage_root, monkeypatch):
    from pipeline.training import cell_training

    p, layout = project(stage_root)
    raw = yaml.safe_load((stage_root / "params.yaml").read_text())
    params = p.model_copy(update={"train": TrainSettings(**{**raw["train"], "batch_size": 60_000})})  # past the schema's own check
    monkeypatch.setattr(cell_training, "load_rows", lambda *a, **k: pytest.fail("read before refusing"))
    with pytest.raises(ValueError, match="train.batch_size: 60000 rows per step, but the training split has only 48000 rows"):
        cell_training.train_cell(params, layout, params.cells()[-1])
    assert BATCHES_IN_FLIGHT == 6 and FeedPlan
    assert open_store(layout.image_embeddings).array.compressors[-1].__class__.__name__ == "Crc32cCodec"
