"""pipeline.scoring.codes and the encoding pass: sparse code sets on disk, read by row, reused by fingerprint."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import sparse

from pipeline.metrics.reconstruction import ReconstructionAccumulator
from pipeline.models.base import half_axes, tensor_csr
from pipeline.models.registry import build
from pipeline.scoring.codes import ArrayCodes, CodesWriter, open_codes
from pipeline.scoring.encoding_pass import encode_rows
from pipeline.store import StoreError, write_array


def random_csr(n: int, latents: int, seed: int) -> sparse.csr_array:
    rng = np.random.default_rng(seed)
    dense = np.where(rng.random((n, latents)) < 0.1, rng.random((n, latents)) + 0.5, 0.0).astype(np.float32)
    dense[3] = 0.0  # an empty row
    return sparse.csr_array(dense)


def test_code_set_round_trip_and_reads_any_rows(tmp_path):
    codes = random_csr(50, 12, 0)
    rows = np.arange(100, 150) * 2  # source rows are not positions
    writer = CodesWriter(tmp_path / "set", 12, {"what": "test"})
    for block in (slice(0, 7), slice(7, 30), slice(30, 50)):
        writer.append(rows[block], sparse.csr_array(codes[block]))
    read = writer.finalize({"fvu": 0.5})
    assert len(read) == 50 and read.n_latents == 12 and read.stats == {"fvu": 0.5} and not (tmp_path / "set.tmp").exists()
    np.testing.assert_array_equal(read.read().toarray(), codes.toarray())
    positions = np.array([49, 3, 0, 17, 17])
    np.testing.assert_array_equal(read.read(positions).toarray(), codes.toarray()[positions])
    np.testing.assert_array_equal(read.codes(rows[[5, 1]]).toarray(), codes.toarray()[[5, 1]])
    with pytest.raises(ValueError, match="row 201 has no code here"):
        read.codes(np.array([201]))
    assert read.read(np.array([3])).nnz == 0
    memory = ArrayCodes(rows, codes)
    np.testing.assert_array_equal(memory.codes(rows[[9, 2]]).toarray(), read.codes(rows[[9, 2]]).toarray())
    with pytest.raises(StoreError, match="no code set"):
        open_codes(tmp_path / "missing")


def test_sparse_latents_equal_the_dense_latent_view():
    x = torch.randn(40, 6)
    for model in (build("topk", 6, 16, 3, seed=1), build("pca", 6, 6, 2)):
        model.fit_init(x)
        dense = model.latents(model.encode(x)).detach().numpy()
        np.testing.assert_array_equal(model.sparse_latents(x.numpy()).toarray(), dense)
        np.testing.assert_allclose(model.sparse_latents(x.numpy(), batch_size=7).toarray(), dense, atol=1e-5)  # batches: rounding only
        raw = model.encode(x)
        converted = half_axes(tensor_csr(raw)) if model.signed else tensor_csr(raw)
        np.testing.assert_array_equal(converted.toarray(), dense)


def test_one_pass_gives_the_accumulators_numbers_and_the_codes(tmp_path):
    rng = np.random.default_rng(2)
    x = (rng.normal(size=(300, 5)) + 4.0).astype(np.float32)
    store = write_array(tmp_path / "x.zarr", x, fingerprint={"x": 1}, chunk_rows=64)
    model = build("cedar", 5, 5, 2, seed=0)
    model.fit_init(torch.as_tensor(x))
    rows = np.sort(rng.choice(300, 170, replace=False))
    seen = []
    writer = CodesWriter(tmp_path / "codes", model.n_half_latents, {})
    stats = encode_rows(model, store, rows, batch_size=50, codes=writer, on_batch=lambda r, xb, xh: seen.append(r))
    acc = ReconstructionAccumulator(5, 5)
    with torch.no_grad():
        for block in np.array_split(rows, 4):
            codes = model.encode(torch.as_tensor(x[block]))
            acc.update(x[block], model.decode(codes).numpy(), codes.numpy())
    expected = acc.result()
    assert stats.n == 170 and stats.l0 == expected.l0 and stats.dead_fraction == expected.dead_fraction
    assert stats.fvu == pytest.approx(expected.fvu, rel=1e-6)
    np.testing.assert_array_equal(np.concatenate(seen), rows)
    written = writer.finalize({"fvu": stats.fvu})
    np.testing.assert_array_equal(written.rows, rows)
    np.testing.assert_allclose(written.read().toarray(), model.sparse_latents(x[rows]).toarray(), rtol=1e-6, atol=1e-7)  # batches round apart
    with pytest.raises(ValueError, match="ascending, unique"):
        encode_rows(model, store, rows[::-1], batch_size=50)
    codes_only = CodesWriter(tmp_path / "codes_only", model.n_half_latents, {})
    assert encode_rows(model, store, rows, batch_size=50, codes=codes_only, reconstruct=False) is None
    np.testing.assert_array_equal(codes_only.finalize().read().toarray(), written.read().toarray())


def test_a_code_set_is_reused_only_while_its_fingerprint_holds(tmp_path, caplog):
    from pipeline.scoring.cell_evaluation import encoded

    x = np.random.default_rng(3).normal(size=(80, 4)).astype(np.float32)
    store = write_array(tmp_path / "x.zarr", x, fingerprint={"x": 1})
    model = build("topk", 4, 8, 2, seed=0)
    model.fit_init(torch.as_tensor(x))
    rows = np.arange(0, 80, 2)
    first = encoded(model, store, rows, 16, tmp_path / "c", {"model": "a"})
    stamp = (tmp_path / "c" / "values.zarr" / "zarr.json").stat().st_mtime_ns
    with caplog.at_level("INFO"):
        again = encoded(model, store, rows, 16, tmp_path / "c", {"model": "a"})
    assert "codes unchanged, reused" in caplog.text and (tmp_path / "c" / "values.zarr" / "zarr.json").stat().st_mtime_ns == stamp
    np.testing.assert_array_equal(again.read().toarray(), first.read().toarray())
    other = encoded(model, store, rows[:10], 16, tmp_path / "c", {"model": "b"})
    assert len(other) == 10


def test_a_passes_statistics_come_back_as_the_same_typed_results_when_its_code_set_is_reused(tmp_path):
    """The test pass keeps its reconstruction statistics and probe scores in meta.json (`pass_stats`); `pass_result`
    parses them, whether the set was just written or reused; a NaN comes back `Undefined` with its reason; a set
    without a kind's scores is refused by name."""
    from pipeline.records import Undefined
    from pipeline.scoring.cell_evaluation import encoded, pass_result
    from pipeline.scoring.concepts import ProbeScores

    class Stream:  # a probe stream that scores nothing but records the rows it saw
        def __init__(self, scores):
            self.scores, self.rows = scores, []

        def add(self, rows, x, x_hat):
            self.rows.append(rows)

        def result(self):
            return self.scores

    x = np.random.default_rng(4).normal(size=(60, 4)).astype(np.float32)
    store = write_array(tmp_path / "x.zarr", x, fingerprint={"x": 1})
    model = build("topk", 4, 8, 2, seed=0)
    model.fit_init(torch.as_tensor(x))
    rows = np.arange(0, 60, 3)
    scores = ProbeScores(0.5, 0.75, 0.125, 1.0, float("inf"))
    streams = {"objects": Stream(scores), "multi": Stream(None)}
    first = encoded(model, store, rows, 7, tmp_path / "c", {"model": "a"}, streams)
    np.testing.assert_array_equal(np.concatenate(streams["objects"].rows), rows)
    reconstruction, probes = pass_result(first, ["objects", "multi"])
    assert reconstruction.n == 20 and reconstruction.l0 == 2.0 and probes["multi"] is None
    assert probes["objects"].ce_original == 0.5 and probes["objects"].kl == 0.125
    assert isinstance(probes["objects"].accuracy_reconstruction, Undefined) and probes["objects"].accuracy_reconstruction.reason == "infinite"
    again = encoded(model, store, rows, 7, tmp_path / "c", {"model": "a"}, {"objects": Stream(None), "multi": Stream(None)})
    assert pass_result(again, ["objects", "multi"])[0] == reconstruction
    assert pass_result(again, ["objects"])[1]["objects"].kl == 0.125
    with pytest.raises(ValueError, match="no probe scores of kind 'scenes'"):
        pass_result(again, ["scenes"])
