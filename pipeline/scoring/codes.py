"""Sparse codes of a model on a set of rows: computed batch by batch, kept on disk as CSR beside the model.

A k-sparse code is (column indices, values) per row. The evaluation of a grid cell encodes each row set it needs
(the test split, the matching rows, both sides of the intervention pairs) once per model, batch by batch, and
writes the non-negative latent activations (`SparseModel.latents`, the half-axis view of signed models) here;
the concept metrics and the explanations then read the rows they need from these stores instead of encoding again,
and nothing of size (rows, latents) is ever dense in memory.

Layout of one code set (a folder, written to `<name>.tmp` and renamed into place when complete):

    nnz.zarr       int32   (n,)    non-zeros of each row
    indices.zarr   int32   (nnz,)  their latent (column) indices, ascending within a row
    values.zarr    float32 (nnz,)  their activations (> 0)
    rows.zarr      int64   (n,)    the row of the source store each code row belongs to
    meta.json      n_latents, the fingerprint of what was encoded, and any statistics of the pass

`RandomCodes` gives the sanity-check baseline in the same form: each latent fires independently with a given
frequency, drawn exactly (geometric gaps between successes, vectorised over latents) for blocks of rows seeded by
(seed, stream, block), so any row's code is the same whichever subset is asked for.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from scipy import sparse

from pipeline.atomic import replace_dir, temporary_sibling
from pipeline.metrics.csr import stack_rows
from pipeline.records import write_json
from pipeline.store import Store, StoreError, StoreWriter, open_store

META = "meta.json"
_PARTS = ("nnz", "indices", "values", "rows")


class CodesWriter:
    """Append code rows (a CSR block and the source rows it belongs to); `finalize` renames the set into place.

    A previous unfinished write is discarded (the encoding restarts): four stores committed to different lengths
    could not be resumed consistently, and one pass of encoding is cheap next to what it feeds.
    """

    def __init__(self, path: str | Path, n_latents: int, fingerprint: dict[str, Any]) -> None:
        self.path = Path(path)
        self.tmp = temporary_sibling(self.path)
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir(parents=True)
        self.n_latents = int(n_latents)
        self.fingerprint = fingerprint
        dtypes = {"nnz": np.int32, "indices": np.int32, "values": np.float32, "rows": np.int64}
        self.writers = {part: StoreWriter(self.tmp / f"{part}.zarr", (), dtypes[part], fingerprint=fingerprint) for part in _PARTS}

    def append(self, rows: np.ndarray, codes: sparse.csr_array) -> None:
        """rows: int (b,) source rows; codes: CSR (b, n_latents) with non-negative values and sorted indices."""
        if codes.shape != (len(rows), self.n_latents):
            raise ValueError(f"{self.path}: codes of shape {codes.shape} for {len(rows)} rows of {self.n_latents} latents")
        codes.eliminate_zeros()
        self.writers["nnz"].append(np.diff(codes.indptr).astype(np.int32))
        self.writers["indices"].append(codes.indices.astype(np.int32))
        self.writers["values"].append(codes.data.astype(np.float32))
        self.writers["rows"].append(np.asarray(rows, dtype=np.int64))

    def finalize(self, stats: dict[str, Any] | None = None) -> "CodeSet":
        for writer in self.writers.values():
            writer.close()  # reopened once, together, by open_codes below
        write_json(self.tmp / META, {"n_latents": self.n_latents, "fingerprint": self.fingerprint, "stats": stats or {}})
        replace_dir(self.tmp, self.path)
        return open_codes(self.path)


@dataclass
class CodeSet:
    """A finished code set opened for reading (see the module docstring); rows are addressed by position 0..n-1."""

    path: Path
    meta: dict[str, Any]
    nnz: np.ndarray  # int64 (n,)
    rows: np.ndarray  # int64 (n,) source rows
    indices: Store
    values: Store

    @property
    def n_latents(self) -> int:
        return int(self.meta["n_latents"])

    @property
    def stats(self) -> dict[str, Any]:
        return dict(self.meta.get("stats", {}))

    def __len__(self) -> int:
        return len(self.nnz)

    @cached_property
    def indptr(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.nnz)]).astype(np.int64)

    def read(self, positions: np.ndarray | None = None) -> sparse.csr_array:
        """CSR (len(positions), n_latents) float32 of these row positions (any order; None: all rows), reading only
        their entries."""
        if positions is None:
            start, stop = 0, int(self.indptr[-1])
            indptr = self.indptr
            return sparse.csr_array((self.values.read(start, stop), self.indices.read(start, stop), indptr),
                                    shape=(len(self), self.n_latents))
        positions = np.asarray(positions, dtype=np.int64)
        counts = self.nnz[positions]
        starts = self.indptr[positions]
        entries = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts) + np.arange(int(counts.sum()))
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        if entries.size == 0:
            return sparse.csr_array((np.zeros(0, np.float32), np.zeros(0, np.int32), indptr), shape=(len(positions), self.n_latents))
        return sparse.csr_array((self.values.take(entries), self.indices.take(entries), indptr), shape=(len(positions), self.n_latents))

    def codes(self, rows: np.ndarray) -> sparse.csr_array:
        """The codes of source rows `rows` (any order; each must be in this set)."""
        return self.read(_positions(self.rows, rows, self.path))


def _positions(have: np.ndarray, rows: np.ndarray, where: object) -> np.ndarray:
    """Positions in `have` (int64, ascending) of `rows`; a clear error if one is missing."""
    rows = np.asarray(rows, dtype=np.int64)
    positions = np.searchsorted(have, rows)
    missing = (positions >= len(have)) | (have[np.minimum(positions, len(have) - 1)] != rows) if len(have) else rows == rows
    if missing.any():
        raise ValueError(f"{where}: row {int(rows[missing][0])} has no code here ({len(have)} rows encoded)")
    return positions


@dataclass(frozen=True)
class ArrayCodes:
    """Codes held in memory: CSR (n, L) of source rows `rows` (int64, ascending); the code sets' `codes(rows)`
    interface for small data (tests, notebooks)."""

    rows: np.ndarray
    matrix: sparse.csr_array

    @property
    def n_latents(self) -> int:
        return self.matrix.shape[1]

    def codes(self, rows: np.ndarray) -> sparse.csr_array:
        return sparse.csr_array(self.matrix[_positions(self.rows, rows, "codes")])


def open_codes(path: str | Path) -> CodeSet:
    """Open a finished code set; a clear error if it is missing or incomplete."""
    path = Path(path)
    if not (path / META).is_file():
        raise StoreError(f"{path}: no code set here (the evaluation writes it)")
    meta = json.loads((path / META).read_text())
    stores = {part: open_store(path / f"{part}.zarr") for part in _PARTS}
    return CodeSet(path, meta, stores["nnz"].read().astype(np.int64), stores["rows"].read(), stores["indices"], stores["values"])


def bernoulli_csr(rng: np.random.Generator, n_rows: int, frequency: np.ndarray) -> sparse.csr_array:
    """CSR (n_rows, L) float32 of ones where latent l fires with probability frequency[l], independently per entry.

    Exact and O(non-zeros): the rows where a latent fires are the partial sums of geometric(p_l) gaps; enough gaps
    are drawn per latent (mean + 6 sd + 10) and a latent whose gaps did not pass the last row (about one in 10^9)
    is drawn again with twice as many.
    """
    frequency = np.clip(np.asarray(frequency, dtype=np.float64), 0.0, 1.0)
    latents = np.flatnonzero(frequency > 0)
    row_parts, column_parts = [], []
    spare = 1.0
    while latents.size:
        p = frequency[latents]
        mean = n_rows * p
        draws = np.minimum(n_rows, np.ceil(spare * (mean + 6.0 * np.sqrt(mean * (1.0 - p)) + 10.0))).astype(np.int64)
        total = np.cumsum(rng.geometric(np.repeat(p, draws)))
        ends = np.cumsum(draws)
        position = total - np.repeat(np.concatenate([[0], total[ends[:-1] - 1]]), draws) - 1  # 0-based rows of the successes
        covered = position[ends - 1] >= n_rows - 1
        keep = np.repeat(covered, draws) & (position < n_rows)
        row_parts.append(position[keep])
        column_parts.append(np.repeat(latents, draws)[keep])
        latents, spare = latents[~covered], 2.0 * spare
    rows = np.concatenate([np.zeros(0, np.int64), *row_parts])
    columns = np.concatenate([np.zeros(0, np.int64), *column_parts])
    out = sparse.csr_array((np.ones(rows.size, dtype=np.float32), (rows, columns)), shape=(n_rows, len(frequency)))
    out.sort_indices()
    return out


@dataclass(frozen=True)
class RandomCodes:
    """Random codes for the sanity check: latent l fires with `frequency[l]` (magnitude 1) on every row,
    independently; rows are drawn in blocks of `block_rows` seeded by (seed, stream, block), so `codes` of any
    rows of a stream always gives the same code for the same row, whatever else is asked for with it."""

    frequency: np.ndarray
    seed: int
    stream: int
    block_rows: int = 4096

    @property
    def n_latents(self) -> int:
        return len(self.frequency)

    def codes(self, rows: np.ndarray) -> sparse.csr_array:
        """CSR (len(rows), L) float32 of these rows of the stream (any order; a row's code depends on it alone)."""
        positions = np.asarray(rows, dtype=np.int64)
        block_of = positions // self.block_rows
        order = np.argsort(block_of, kind="stable")
        parts = []
        for block in np.unique(block_of):  # a loop over blocks of rows, each drawn whole
            drawn = bernoulli_csr(np.random.default_rng([self.seed, self.stream, int(block)]), self.block_rows, self.frequency)
            parts.append(drawn[positions[order][block_of[order] == block] % self.block_rows])
        return stack_rows(parts, self.n_latents)[np.argsort(order, kind="stable")]
