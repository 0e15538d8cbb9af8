"""Chunked zarr (v3) array stores: the only module that knows zarr.

A store is one zarr array of rows (embeddings (n, d) float32, images (n, H, W, 3) uint8,
labels (n, A) bool ...) with JSON attributes for provenance.

Writing (`StoreWriter`):
- rows are appended in batches of any size and written in whole chunks; the number of rows
  durably written (`rows_committed`, a multiple of the chunk length) is recorded after each
  chunk, so a killed writer resumes from its last complete chunk;
- everything happens in a `<name>.partial` sibling; `finalize()` (or `close()`, which does not reopen it) trims the
  array, marks it complete and renames it into place, so a finished-looking store is always a complete one;
- a partial store whose `fingerprint` (what it is computed from: inputs and params) differs
  from the new writer's is discarded rather than resumed.

Reading (`open_store`, `Store`): row ranges, batch iteration and shuffled batch streams that
never hold more than a few chunks in memory; `read_ranges` reads many row ranges in a thread pool, a bounded
number ahead of the caller, in order (zarr decodes and checks chunks with the GIL released, so the threads
read in parallel).

Codec: float rows (embeddings, codes' values) are stored uncompressed: they barely compress (zstd saved 15% on
embeddings) and decompressing them cost 20 times more than reading them (150 k rows/s of d = 768 on one core,
the training stage's bottleneck); integer and boolean rows (images, labels) are zstd-compressed. Either way every
chunk carries its checksum. A read of whole uncompressed chunks goes straight from the chunk files into the
result (`_read_plain`: each file read into its rows, its CRC-32C checked with the library zarr's codec uses), 2-2.5x
faster than zarr's own path, which copies every chunk twice more; any other read goes through zarr.

Integrity: every chunk ends with a CRC-32C checksum (zarr's `crc32c` codec) and every chunk is written, even one
that equals the fill value, so a finished store has all its chunk files. Opening a store checks that they are
all there; every read checks the checksums of the chunks it touches. A damaged or missing chunk is a
`StoreError` naming the store and the chunk (never zeros or garbage); `Store.verify()` reads every chunk once
(before a finished store is kept instead of rewritten), and a resumed writer restarts from its first chunk that
fails the check.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec
from zarr.storage import LocalStore

from pipeline.atomic import replace_dir

log = logging.getLogger(__name__)

TARGET_CHUNK_BYTES = 2 << 20  # ~2 MiB per chunk: large enough for fast I/O, small enough to resume cheaply


class StoreError(RuntimeError):
    """A store is missing, incomplete, damaged or does not match what the caller expects."""


#: how to recover from a damaged store: its producing stage rewrites it
RERUN = "rerun the stage that writes it (`dvc repro` does, as the store no longer matches dvc.lock)"


def _chunk_key(array: zarr.Array, index: int) -> str:
    """The store key of row-chunk `index` ("c/3/0" for a 2-D array)."""
    return array.metadata.encode_chunk_key((index,) + (0,) * (array.ndim - 1))


def _n_chunks(array: zarr.Array, rows: int) -> int:
    return -(-rows // int(array.chunks[0]))


def _chunk_problem(path: Path, array: zarr.Array, index: int, read: bool) -> str | None:
    """Why row-chunk `index` of the store at `path` is unusable (missing file; with `read`, a failed checksum or
    decode), or None if it is fine."""
    key = _chunk_key(array, index)
    if not (path / key).is_file():
        return f"chunk {key} is missing"
    if read:
        rows = int(array.chunks[0])
        try:
            array[index * rows : (index + 1) * rows]
        except Exception as e:  # the crc32c codec raises ValueError, a truncated blosc frame other errors
            return f"chunk {key} is damaged ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    return None


def _first_bad_chunk(path: Path, array: zarr.Array, rows: int, read: bool) -> str | None:
    """The problem of the first unusable chunk among those holding rows [0, rows), or None."""
    for index in range(_n_chunks(array, rows)):
        problem = _chunk_problem(path, array, index, read)
        if problem:
            return problem
    return None


def partial_path(path: Path) -> Path:
    return path.with_name(path.name + ".partial")


def default_chunk_rows(row_shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Rows per chunk so that a chunk is about TARGET_CHUNK_BYTES."""
    row_bytes = int(np.prod(row_shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return max(1, TARGET_CHUNK_BYTES // max(row_bytes, 1))


class StoreWriter:
    """Append rows to a new (or resumed) store at `path`; call `finalize()` when done.

    row_shape/dtype: shape and dtype of one row. expected_rows: the final length if known
    (the array is preallocated; otherwise it grows chunk by chunk). fingerprint: JSON-able
    description of the inputs; a partial store is resumed only if it matches. compress: zstd-compress the chunks
    (None: unless the rows are floats, see the module docstring).

    The array is created when its first whole chunk is written; a store finished before that (fewer rows than
    `chunk_rows`: code sets, labels, small embedding sets) is one chunk of exactly its rows. zarr stores an edge
    chunk at full size, so a 2 MiB chunk would otherwise hold the zeros of the rows it lacks on disk (an
    uncompressed code set of 1,000 pairs: 2 MiB for 128 KB of values).
    """

    def __init__(
        self,
        path: str | Path,
        row_shape: tuple[int, ...],
        dtype: Any,
        *,
        fingerprint: dict[str, Any],
        attrs: dict[str, Any] | None = None,
        expected_rows: int | None = None,
        chunk_rows: int | None = None,
        compress: bool | None = None,
    ) -> None:
        self.path = Path(path)
        self.tmp = partial_path(self.path)
        self.row_shape = tuple(int(s) for s in row_shape)
        self.dtype = np.dtype(dtype)
        self.chunk_rows = int(chunk_rows or default_chunk_rows(self.row_shape, self.dtype))
        self.expected_rows = expected_rows
        self.fingerprint = json.loads(json.dumps(fingerprint))
        self._buffer: list[np.ndarray] = []
        self._buffered = 0
        self.attrs = attrs or {}
        self.compress = self.dtype.kind != "f" if compress is None else compress
        self.array: zarr.Array | None = self._resumable()
        self.rows_committed = self._intact_rows(int(self.array.attrs["rows_committed"])) if self.array is not None else 0
        if self.rows_committed:
            log.info("%s: resuming after %d rows already written", self.path, self.rows_committed)

    def _intact_rows(self, committed: int) -> int:
        """Rows of the committed chunks up to the first one that is missing or fails its checksum (a resumed
        partial store is verified before more rows are added to it)."""
        for index in range(committed // self.chunk_rows):
            problem = _chunk_problem(self.tmp, self.array, index, read=True)
            if problem:
                log.warning("%s: %s; resuming from there", self.tmp, problem)
                return index * self.chunk_rows
        return committed

    def _resumable(self) -> zarr.Array | None:
        """The partial store of the same inputs and layout left by an interrupted writer, or None (any other partial
        store is deleted)."""
        if self.tmp.exists():
            try:
                array = zarr.open_array(LocalStore(self.tmp), mode="r+")
                same = (
                    array.attrs.get("fingerprint") == self.fingerprint
                    and tuple(array.shape[1:]) == self.row_shape
                    and np.dtype(array.dtype) == self.dtype
                    and array.chunks[0] == self.chunk_rows
                    and _checksummed(array)
                    and _compressed(array) == self.compress
                )
            except Exception as e:  # a partial store too broken to open is simply restarted
                log.warning("%s: unreadable partial store (%s); starting over", self.tmp, e)
                same = False
            if same:
                return array.with_config({"write_empty_chunks": True})
            log.info("%s: partial store is from other inputs; starting over", self.tmp)
            shutil.rmtree(self.tmp)
        return None

    def _create(self, rows: int) -> zarr.Array:
        """The new partial store's array: `rows` rows (the expected length when known) in chunks of `chunk_rows`."""
        self.tmp.parent.mkdir(parents=True, exist_ok=True)
        return zarr.create_array(
            store=LocalStore(self.tmp),
            shape=(rows, *self.row_shape),
            chunks=(self.chunk_rows, *self.row_shape),
            dtype=self.dtype,
            compressors=[BloscCodec(cname="zstd", clevel=3), Crc32cCodec()] if self.compress else [Crc32cCodec()],
            fill_value=0,
            attributes={**self.attrs, "fingerprint": self.fingerprint, "rows_committed": 0, "complete": False},
        ).with_config({"write_empty_chunks": True})

    @property
    def n_rows(self) -> int:
        """Rows accepted so far (committed plus buffered): where the caller's input should continue."""
        return self.rows_committed + self._buffered

    def append(self, batch: np.ndarray) -> None:
        """Add rows (b, *row_shape); written to disk whenever a whole chunk is available."""
        batch = np.asarray(batch)
        if batch.shape[1:] != self.row_shape:
            raise ValueError(f"{self.path}: rows of shape {self.row_shape} expected, got a batch of shape {batch.shape}")
        if batch.dtype.kind == "f" and not np.isfinite(batch).all():
            raise ValueError(f"{self.path}: batch contains NaN or infinite values (rows {self.n_rows}..{self.n_rows + len(batch)})")
        if self.expected_rows is not None and self.n_rows + len(batch) > self.expected_rows:
            raise ValueError(f"{self.path}: more rows than the expected {self.expected_rows}")
        self._buffer.append(batch.astype(self.dtype, copy=False))
        self._buffered += len(batch)
        if self._buffered >= self.chunk_rows:
            self._flush(last=False)

    def _flush(self, last: bool) -> None:
        """Write the buffered whole chunks (last: every buffered row). The array grows a chunk ahead while rows come;
        the last write sizes it exactly and leaves the `rows_committed` marker to `close`'s one metadata write
        (an interruption before it resumes from the previous marker, rewriting only that tail)."""
        if not self._buffered:
            return
        data = np.concatenate(self._buffer)
        n = len(data) if last else (len(data) // self.chunk_rows) * self.chunk_rows
        if n == 0:
            return
        start, stop = self.rows_committed, self.rows_committed + n
        if self.array is None:
            self.array = self._create(max(stop, self.expected_rows or 0))
        if self.array.shape[0] < stop:
            grow = stop if last else max(stop, self.array.shape[0] + self.chunk_rows)
            self.array.resize((grow, *self.row_shape))
        self.array[start:stop] = data[:n]
        self.rows_committed = stop
        if not last:
            self.array.attrs["rows_committed"] = stop  # durable marker written after the chunk data
        rest = data[n:]
        self._buffer = [rest] if len(rest) else []
        self._buffered = len(rest)

    def close(self, extra_attrs: dict[str, Any] | None = None) -> Path:
        """Write what is buffered, trim to length, mark complete and rename into place; returns the store's path.
        The final attributes are one metadata write (zarr's `attrs.update` writes the metadata once per key)."""
        if self.array is None:  # not a whole chunk written: one chunk of exactly the rows
            self.chunk_rows = max(1, self._buffered)
            self.array = self._create(self._buffered)
        self._flush(last=True)
        if self.expected_rows is not None and self.rows_committed != self.expected_rows:
            raise StoreError(f"{self.path}: {self.rows_committed} rows written, {self.expected_rows} expected")
        if self.array.shape[0] != self.rows_committed:
            self.array.resize((self.rows_committed, *self.row_shape))
        # no timestamp: the same inputs must give byte-identical stores (DVC and the flow compare hashes)
        self.array = self.array.update_attributes({**(extra_attrs or {}), "complete": True, "n_rows": self.rows_committed,
                                                   "rows_committed": self.rows_committed})
        replace_dir(self.tmp, self.path)
        return self.path

    def finalize(self, extra_attrs: dict[str, Any] | None = None) -> "Store":
        """`close`, then the finished store opened for reading."""
        return open_store(self.close(extra_attrs))


def write_array(path: str | Path, data: np.ndarray, *, fingerprint: dict[str, Any], attrs: dict[str, Any] | None = None, chunk_rows: int | None = None) -> "Store":
    """Write a whole in-memory array as a complete store (small arrays: labels, splits, vocab embeddings)."""
    data = np.asarray(data)
    writer = StoreWriter(path, data.shape[1:], data.dtype, fingerprint=fingerprint, attrs=attrs, expected_rows=len(data), chunk_rows=chunk_rows)
    if writer.rows_committed:  # a resumed partial copy of the same data: rewrite it whole, it is small
        shutil.rmtree(writer.tmp)
        writer = StoreWriter(path, data.shape[1:], data.dtype, fingerprint=fingerprint, attrs=attrs, expected_rows=len(data), chunk_rows=chunk_rows)
    writer.append(data)
    return writer.finalize()


class Store:
    """Read-only view of a complete store."""

    def __init__(self, path: Path, array: zarr.Array) -> None:
        self.path = path
        self.array = array

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.array.dtype)

    @property
    def chunk_rows(self) -> int:
        return int(self.array.chunks[0])

    @property
    def attrs(self) -> dict[str, Any]:
        return self.array.attrs.asdict()

    def __len__(self) -> int:
        return int(self.array.shape[0])

    def _checked(self, read: Callable[[], Any], chunks: Iterable[int]) -> np.ndarray:
        """`read()` as a numpy array; if it fails, a StoreError naming the first damaged chunk among `chunks`."""
        try:
            return np.asarray(read())
        except (IndexError, TypeError):  # a selection outside the store: the caller's error, not the store's
            raise
        except Exception as e:
            for index in chunks:
                problem = _chunk_problem(self.path, self.array, int(index), read=True)
                if problem:
                    raise StoreError(f"{self.path}: {problem}; {RERUN}") from None
            raise StoreError(f"{self.path}: unreadable ({str(e).splitlines()[0] if str(e) else type(e).__name__}); {RERUN}") from e

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows [start, stop) as a numpy array (the chunks' checksums are checked)."""
        lo, hi, _ = slice(start, stop).indices(len(self))
        plain = self._plain and lo % self.chunk_rows == 0 and (hi % self.chunk_rows == 0 or hi == len(self)) and hi > lo
        return self._checked(lambda: self._read_plain(lo, hi) if plain else self.array[start:stop],
                             range(lo // self.chunk_rows, -(-hi // self.chunk_rows)))

    @property
    def _plain(self) -> bool:
        """Whether each chunk file is the chunk's rows as little-endian bytes followed by their CRC-32C (uncompressed
        stores on a little-endian machine), whole rows per chunk."""
        codecs = self.array.metadata.codecs
        return (sys.byteorder == "little" and len(codecs) == 2 and isinstance(codecs[0], BytesCodec) and isinstance(codecs[1], Crc32cCodec)
                and (codecs[0].endian is None or codecs[0].endian.value == "little") and tuple(self.array.chunks[1:]) == self.shape[1:])

    def _read_plain(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) (chunk-aligned; `stop` may be the store's end) of a `_plain` store, each chunk file read
        into its rows of the result and its checksum checked; ValueError for a missing, short or damaged file (the
        caller names the chunk)."""
        out = np.empty((stop - start, *self.shape[1:]), dtype=self.dtype)
        flat = out.reshape(len(out), -1).view(np.uint8)
        chunk_bytes = self.chunk_rows * flat.shape[1]
        for index in range(start // self.chunk_rows, -(-stop // self.chunk_rows)):
            first = index * self.chunk_rows - start
            rows = flat[first : first + self.chunk_rows]
            whole = len(rows) == self.chunk_rows  # the last chunk of the store is stored padded to a whole chunk
            target = rows.reshape(-1) if whole else np.empty(chunk_bytes, np.uint8)
            with open(self.path / _chunk_key(self.array, index), "rb", buffering=0) as f:
                if f.readinto(target) != chunk_bytes or len(checksum := f.read(5)) != 4:
                    raise ValueError("chunk file of the wrong size")
            if google_crc32c.value(target) != int.from_bytes(checksum, "little"):
                raise ValueError("checksum mismatch")
            if not whole:
                rows[:] = target[: rows.size].reshape(rows.shape)
        return out

    def read_ranges(self, ranges: Iterable[tuple[int, int]], threads: int | None = None, ahead: int | None = None,
                    apply: Callable[[int, np.ndarray], Any] | None = None) -> Iterator[Any]:
        """Rows [start, stop) of each range (or `apply(start, rows)` of them, run in the reading thread), in the order
        given, read by a pool of `threads` threads (default: the cores) at most `ahead` ranges (default 2 x threads)
        ahead of the caller: memory holds `ahead` ranges' rows whatever their number. Checksums are checked as by
        `read`; the first error is raised at its range's turn."""
        threads = max(1, threads or os.cpu_count() or 1)
        ahead = max(1, ahead or 2 * threads)

        def task(start: int, stop: int) -> Any:
            rows = self.read(start, stop)
            return rows if apply is None else apply(start, rows)

        pending: deque = deque()
        with ThreadPoolExecutor(threads, thread_name_prefix="store-read") as pool:
            try:
                for start, stop in ranges:
                    pending.append(pool.submit(task, start, stop))
                    if len(pending) >= ahead:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            finally:
                for future in pending:  # abandoned or failed: cancel what has not started
                    future.cancel()

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows at sorted-or-not integer indices (reads only the chunks they fall in)."""
        rows = np.asarray(rows, dtype=np.int64)
        order = np.argsort(rows)
        selection = (rows[order],) + (slice(None),) * (self.array.ndim - 1)
        out = self._checked(lambda: self.array.get_orthogonal_selection(selection), np.unique(rows // self.chunk_rows))
        result = np.empty_like(out)
        result[order] = out
        return result

    def verify(self) -> None:
        """Read every chunk once: a StoreError names the first one that is missing or fails its checksum."""
        problem = _first_bad_chunk(self.path, self.array, len(self), read=True)
        if problem:
            raise StoreError(f"{self.path}: {problem}; {RERUN}")

    def iter_batches(self, batch_size: int, rows: np.ndarray | None = None) -> Iterator[np.ndarray]:
        """Batches in row order, reading one chunk-aligned block at a time; `rows` (bool mask or indices) selects a subset."""
        mask = _mask(rows, len(self))
        block = max(self.chunk_rows, (batch_size // self.chunk_rows + 1) * self.chunk_rows)
        pending: list[np.ndarray] = []
        n_pending = 0
        for start in range(0, len(self), block):
            data = self.read(start, start + block)
            if mask is not None:
                data = data[mask[start : start + block]]
            pending.append(data)
            n_pending += len(data)
            while n_pending >= batch_size:
                joined = np.concatenate(pending)
                yield joined[:batch_size]
                pending, n_pending = [joined[batch_size:]], n_pending - batch_size
        if n_pending:
            yield np.concatenate(pending)

    def shuffled_batches(self, batch_size: int, seed: int, rows: np.ndarray | None = None, buffer_chunks: int = 8,
                         threads: int | None = 1):
        """A BatchSource (epoch -> batches) with a shuffle buffer over chunks: chunk order is permuted,
        `buffer_chunks` chunks are loaded together and their rows permuted (with the rows left over from the
        previous buffer; the last batch of an epoch may be short). The order depends only on (seed, epoch,
        buffer_chunks, the chunking). Chunks are read by `threads` threads (None: the cores), one buffer ahead.
        Memory: two buffers allocated once per epoch (rows gathered, rows permuted), the chunks read ahead, and the
        batches, each its own array, so none keeps a buffer alive and nothing large is allocated per buffer."""
        mask = _mask(rows, len(self))
        n_chunks = -(-len(self) // self.chunk_rows)

        def batches(epoch: int) -> Iterator[np.ndarray]:
            rng = np.random.default_rng([seed, epoch])
            order = rng.permutation(n_chunks)
            spans = [(int(c) * self.chunk_rows, min((int(c) + 1) * self.chunk_rows, len(self))) for c in order]
            reads = self.read_ranges(spans, threads, ahead=buffer_chunks)
            gathered = np.empty((buffer_chunks * self.chunk_rows + batch_size, *self.shape[1:]), dtype=self.dtype)
            shuffled = np.empty_like(gathered)
            carry = 0  # rows left over from the previous buffer, at the start of `gathered`
            try:
                for group_start in range(0, n_chunks, buffer_chunks):
                    filled = carry
                    for lo, _ in spans[group_start : group_start + buffer_chunks]:
                        data = next(reads)
                        if mask is None:
                            gathered[filled : filled + len(data)] = data
                            filled += len(data)
                        else:
                            keep = mask[lo : lo + len(data)]
                            count = int(keep.sum())
                            np.compress(keep, data, axis=0, out=gathered[filled : filled + count])
                            filled += count
                    np.take(gathered[:filled], rng.permutation(filled), axis=0, out=shuffled[:filled], mode="clip")  # unbuffered
                    n_full = (filled // batch_size) * batch_size
                    for start in range(0, n_full, batch_size):
                        yield shuffled[start : start + batch_size].copy()
                    carry = filled - n_full
                    gathered[:carry] = shuffled[n_full:filled]
                if carry:
                    yield gathered[:carry].copy()
            finally:
                reads.close()

        return batches


def _mask(rows: np.ndarray | None, n: int) -> np.ndarray | None:
    if rows is None:
        return None
    rows = np.asarray(rows)
    if rows.dtype == bool:
        if rows.shape != (n,):
            raise ValueError(f"row mask of shape {rows.shape} does not match a store of {n} rows")
        return rows
    mask = np.zeros(n, dtype=bool)
    mask[rows] = True
    return mask


def open_store(path: str | Path) -> Store:
    """Open a complete store for reading; a clear error if it is missing or was never finalised."""
    path = Path(path)
    if not path.exists():
        hint = " (an unfinished write exists: rerun the stage that produces it)" if partial_path(path).exists() else ""
        raise StoreError(f"{path}: no such store{hint}")
    try:
        array = zarr.open_array(LocalStore(path, read_only=True), mode="r")
    except Exception as e:
        raise StoreError(f"{path}: not a readable zarr array ({e})") from None
    if not array.attrs.get("complete", False):
        raise StoreError(f"{path}: store is incomplete (its writer never finalised it)")
    if not _checksummed(array):
        raise StoreError(f"{path}: written without chunk checksums (by an older version of the pipeline); {RERUN}")
    problem = _first_bad_chunk(path, array, int(array.shape[0]), read=False)
    if problem:
        raise StoreError(f"{path}: {problem}; {RERUN}")
    return Store(path, array)


def _compressed(array: zarr.Array) -> bool:
    """Whether `array`'s chunks are zstd-compressed (besides their checksum)."""
    return any(isinstance(codec, BloscCodec) for codec in array.compressors)


def _checksummed(array: zarr.Array) -> bool:
    """Whether every chunk of `array` carries a CRC-32C checksum."""
    return any(isinstance(codec, Crc32cCodec) for codec in array.compressors)
