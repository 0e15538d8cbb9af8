"""pipeline.store: chunked writes, atomic finalise, resume from the last complete chunk, streaming reads."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.store import StoreError, StoreWriter, open_store, partial_path, write_array


def rows(n: int, d: int = 3, start: int = 0) -> np.ndarray:
    return (np.arange(start, start + n, dtype=np.float32)[:, None] * 10 + np.arange(d, dtype=np.float32)).astype(np.float32)


def test_append_in_odd_batches_gives_the_same_rows(tmp_path):
    path = tmp_path / "x.zarr"
    writer = StoreWriter(path, (3,), np.float32, fingerprint={"a": 1}, chunk_rows=4)
    for start, stop in [(0, 3), (3, 4), (4, 11), (11, 13)]:
        writer.append(rows(stop - start, start=start))
    assert not path.exists(), "nothing may look finished before finalize()"
    store = writer.finalize({"note": "hello"})
    assert store.shape == (13, 3)
    np.testing.assert_array_equal(store.read(), rows(13))
    assert store.attrs["note"] == "hello" and store.attrs["complete"] is True and store.attrs["n_rows"] == 13
    assert not partial_path(path).exists()


def test_expected_rows_are_enforced(tmp_path):
    writer = StoreWriter(tmp_path / "x.zarr", (3,), np.float32, fingerprint={}, expected_rows=5, chunk_rows=2)
    writer.append(rows(4))
    with pytest.raises(StoreError, match="4 rows written, 5 expected"):
        writer.finalize()
    with pytest.raises(ValueError, match="more rows than the expected 5"):
        writer.append(rows(2))


def test_resume_continues_from_last_complete_chunk(tmp_path):
    path = tmp_path / "x.zarr"
    crashed = StoreWriter(path, (3,), np.float32, fingerprint={"v": 1}, chunk_rows=4)
    crashed.append(rows(10))  # 8 rows durable (two chunks), 2 buffered and lost in the "crash"
    del crashed
    resumed = StoreWriter(path, (3,), np.float32, fingerprint={"v": 1}, chunk_rows=4)
    assert resumed.n_rows == 8
    resumed.append(rows(6, start=8))
    np.testing.assert_array_equal(resumed.finalize().read(), rows(14))


def test_an_interruption_inside_finalize_resumes_from_the_last_marked_chunk(tmp_path):
    """finalize's last write leaves the rows_committed marker to its one metadata update: stopped between the two,
    the partial store resumes from the last whole chunk marked before, and the tail written after it is rewritten."""
    path = tmp_path / "x.zarr"
    crashed = StoreWriter(path, (3,), np.float32, fingerprint={"v": 1}, chunk_rows=4)
    crashed.append(rows(10))
    flush = crashed._flush

    def interrupted(last: bool) -> None:
        flush(last)
        raise KeyboardInterrupt

    crashed._flush = interrupted
    with pytest.raises(KeyboardInterrupt):
        crashed.finalize()  # the 2 tail rows are written, the marker still says 8
    del crashed
    resumed = StoreWriter(path, (3,), np.float32, fingerprint={"v": 1}, chunk_rows=4)
    assert resumed.n_rows == 8
    resumed.append(rows(6, start=8) + 0.5)  # different tail rows: they must replace what the interrupted write left
    store = resumed.finalize()
    np.testing.assert_array_equal(store.read(), np.concatenate([rows(8), rows(6, start=8) + 0.5]))
    assert store.shape == (14, 3) and store.attrs["rows_committed"] == store.attrs["n_rows"] == 14


def test_partial_store_from_other_inputs_is_discarded(tmp_path):
    path = tmp_path / "x.zarr"
    StoreWriter(path, (3,), np.float32, fingerprint={"v": 1}, chunk_rows=2).append(rows(4))
    fresh = StoreWriter(path, (3,), np.float32, fingerprint={"v": 2}, chunk_rows=2)
    assert fresh.n_rows == 0


def test_bad_rows_are_rejected_with_the_store_named(tmp_path):
    writer = StoreWriter(tmp_path / "x.zarr", (3,), np.float32, fingerprint={})
    with pytest.raises(ValueError, match=r"x.zarr: rows of shape \(3,\) expected"):
        writer.append(np.zeros((2, 4), np.float32))
    bad = rows(2)
    bad[1, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        writer.append(bad)


def test_open_missing_or_incomplete_store_fails_clearly(tmp_path):
    with pytest.raises(StoreError, match="no such store"):
        open_store(tmp_path / "nope.zarr")
    StoreWriter(tmp_path / "half.zarr", (3,), np.float32, fingerprint={}, chunk_rows=2).append(rows(4))
    with pytest.raises(StoreError, match="unfinished write exists"):
        open_store(tmp_path / "half.zarr")


def test_finalize_replaces_an_existing_store(tmp_path):
    path = tmp_path / "x.zarr"
    write_array(path, rows(5), fingerprint={"v": 1})
    write_array(path, rows(2, start=7), fingerprint={"v": 2})
    np.testing.assert_array_equal(open_store(path).read(), rows(2, start=7))


def test_iter_batches_and_take_respect_row_selection(tmp_path):
    store = write_array(tmp_path / "x.zarr", rows(23), fingerprint={}, chunk_rows=4)
    batches = list(store.iter_batches(5))
    assert [len(b) for b in batches] == [5, 5, 5, 5, 3]
    np.testing.assert_array_equal(np.concatenate(batches), rows(23))
    subset = np.array([1, 2, 7, 8, 20])
    np.testing.assert_array_equal(np.concatenate(list(store.iter_batches(2, rows=subset))), rows(23)[subset])
    np.testing.assert_array_equal(store.take(np.array([20, 1, 7])), rows(23)[[20, 1, 7]])


def test_shuffled_batches_cover_the_selection_once_and_repeat_per_seed(tmp_path):
    store = write_array(tmp_path / "x.zarr", rows(50, d=1), fingerprint={}, chunk_rows=4)
    train = np.arange(50) % 5 != 0  # 40 rows
    source = store.shuffled_batches(8, seed=3, rows=train, buffer_chunks=3)
    epoch0 = np.concatenate(list(source(0)))[:, 0]
    assert sorted(epoch0.tolist()) == sorted(rows(50, d=1)[train, 0].tolist())
    np.testing.assert_array_equal(epoch0, np.concatenate(list(store.shuffled_batches(8, seed=3, rows=train, buffer_chunks=3)(0)))[:, 0])
    assert not np.array_equal(epoch0, np.concatenate(list(source(1)))[:, 0])
    assert not np.array_equal(epoch0, np.sort(epoch0)), "rows must be shuffled"


def test_empty_store_is_valid(tmp_path):
    store = write_array(tmp_path / "e.zarr", np.zeros((0, 4, 4, 3), np.uint8), fingerprint={})
    assert store.shape == (0, 4, 4, 3)
    assert list(store.iter_batches(2)) == []


def chunk_file(store_path, index: int):
    """The file of row-chunk `index` of a 2-D store (zarr v3's default key encoding)."""
    return store_path / "c" / str(index) / "0"


def test_a_store_finished_within_its_first_chunk_is_one_chunk_of_exactly_its_rows(tmp_path):
    """zarr keeps an edge chunk at full size: a store of 5 rows in chunks of 1,000 would hold 995 rows of zeros on
    disk. One finished before its first whole chunk is one chunk of its rows; a longer one keeps `chunk_rows`."""
    small = tmp_path / "small.zarr"
    writer = StoreWriter(small, (3,), np.float32, fingerprint={}, chunk_rows=1000)
    writer.append(rows(2))
    writer.append(rows(3, start=2))
    assert not partial_path(small).exists(), "nothing is on disk before a whole chunk or the close"
    assert writer.close({"note": "n"}) == small
    store = open_store(small)
    np.testing.assert_array_equal(store.read(), rows(5))
    assert store.chunk_rows == 5 and store.attrs["note"] == "n"
    assert chunk_file(small, 0).stat().st_size == 5 * 3 * 4 + 4  # the rows and their CRC-32C, no padding
    empty = StoreWriter(tmp_path / "empty.zarr", (3,), np.float32, fingerprint={}, chunk_rows=1000).finalize()
    assert empty.shape == (0, 3)
    large = write_array(tmp_path / "large.zarr", rows(10), fingerprint={}, chunk_rows=4)
    assert large.chunk_rows == 4
    np.testing.assert_array_equal(large.read(), rows(10))


@pytest.mark.parametrize("damage", ["overwrite", "truncate", "delete"])
def test_a_damaged_or_missing_chunk_is_an_error_naming_store_and_chunk(tmp_path, damage):
    path = tmp_path / "x.zarr"
    write_array(path, rows(12), fingerprint={}, chunk_rows=4)
    target = chunk_file(path, 1)
    size = target.stat().st_size
    if damage == "overwrite":  # same size, finite garbage: only the checksum can tell
        target.write_bytes(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes())
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[: size // 2])
    else:
        target.unlink()
    if damage == "delete":  # a finished store with a missing chunk does not even open
        with pytest.raises(StoreError, match=r"x.zarr: chunk c/1/0 is missing; rerun the stage"):
            open_store(path)
        return
    store = open_store(path)
    np.testing.assert_array_equal(store.read(0, 4), rows(4))  # the intact chunks still read
    for read in (lambda: store.read(), lambda: store.read(5, 6), lambda: store.take(np.array([9, 5])), lambda: list(store.iter_batches(3)),
                 lambda: list(store.shuffled_batches(3, seed=0)(0)), store.verify):
        with pytest.raises(StoreError, match=r"x.zarr: chunk c/1/0 is damaged \(.+\); rerun the stage"):
            read()


def test_a_chunk_equal_to_the_fill_value_is_still_written(tmp_path):
    path = tmp_path / "z.zarr"
    write_array(path, np.zeros((8, 2), np.float32), fingerprint={}, chunk_rows=4)
    assert chunk_file(path, 0).is_file() and chunk_file(path, 1).is_file()
    open_store(path).verify()


def test_resume_restarts_from_the_first_damaged_committed_chunk(tmp_path, caplog):
    path = tmp_path / "x.zarr"
    StoreWriter(path, (3,), np.float32, fingerprint={"v": 1}, chunk_rows=4).append(rows(12))  # 3 chunks committed
    target = chunk_file(partial_path(path), 1)
    target.write_bytes(bytes(target.stat().st_size))
    with caplog.at_level("WARNING", logger="pipeline.store"):
        resumed = StoreWriter(path, (3,), np.float32, fingerprint={"v": 1}, chunk_rows=4)
    assert resumed.n_rows == 4 and "chunk c/1/0 is damaged" in caplog.text
    resumed.append(rows(8, start=4))
    np.testing.assert_array_equal(resumed.finalize().read(), rows(12))


def test_a_store_without_checksums_is_refused(tmp_path):
    import zarr

    path = tmp_path / "old.zarr"
    array = zarr.create_array(str(path), shape=(4, 3), chunks=(2, 3), dtype="float32", attributes={"complete": True})
    array[:] = rows(4)
    with pytest.raises(StoreError, match="written without chunk checksums"):
        open_store(path)


def test_a_selection_outside_the_store_is_not_reported_as_damage(tmp_path):
    store = write_array(tmp_path / "x.zarr", rows(8), fingerprint={}, chunk_rows=4)
    with pytest.raises(IndexError):
        store.take(np.array([1, 20]))


def test_whole_chunks_of_an_uncompressed_store_read_straight_from_their_files_equal_zarrs_read(tmp_path, monkeypatch):
    """Float rows are stored uncompressed (bytes + CRC-32C); a read of whole chunks bypasses zarr's copies and gives
    the same rows, the store's last (padded) chunk included; any other read goes through zarr."""
    from pipeline.store import Store

    x = np.random.default_rng(0).normal(size=(30, 3)).astype(np.float32)
    store = write_array(tmp_path / "f.zarr", x, fingerprint={}, chunk_rows=8)
    assert [type(c).__name__ for c in store.array.metadata.codecs] == ["BytesCodec", "Crc32cCodec"] and store._plain
    assert not write_array(tmp_path / "u.zarr", np.arange(30, dtype=np.uint8).reshape(10, 3), fingerprint={})._plain, "integers: compressed"
    plain = []
    original = Store._read_plain
    monkeypatch.setattr(Store, "_read_plain", lambda self, a, b: plain.append((a, b)) or original(self, a, b))
    for start, stop in [(0, 30), (8, 16), (16, 30), (24, 30), (0, 8), (3, 17), (0, 29)]:
        np.testing.assert_array_equal(store.read(start, stop), x[start:stop])
    assert plain == [(0, 30), (8, 16), (16, 30), (24, 30), (0, 8)], "only whole chunks (or up to the end) take the direct path"
    np.testing.assert_array_equal(np.concatenate(list(store.read_ranges([(0, 16), (16, 30)], threads=2))), x)
