"""How a training stage's rows reach the steps: resident on the training device, or streamed from the store.

The training stage of a sparse model reads its rows from a zarr store (`pipeline.store`). `plan_feed` decides,
before any row is read, how (`TrainSettings.feed`, `feed_memory`, `shuffle_rows`):

- **resident** (the split fits the memory budget): `load_rows` reads the training split and the validation and
  initialisation samples in one pass over the store (chunks read in parallel by a thread pool; on a GPU through
  page-locked buffers with non-blocking copies) into tensors on the training device. Each epoch is a seeded full
  permutation of the training rows (numpy's generator seeded by (seed, epoch), drawn on the host once per epoch and
  copied to the device as one index tensor, each batch's rows then taken in ascending row order); a batch is an index
  gather on the device (`pipeline.training.loop.array_batches`), so a step makes no host round trip and every device
  sees the same batches.
- **streaming** (it does not fit): the validation and initialisation samples are read as above; the training rows
  stream from the store (`Store.shuffled_batches`: chunk order permuted per epoch, rows permuted within windows of
  `shuffle_rows` rows, whole chunks, chunks read by a thread pool one window ahead) in a background thread that
  keeps `QUEUED_BATCHES` batches ready (page-locked on a GPU). The shuffle is weaker than resident's (rows meet only rows
  of their window) and the order differs from resident's; it depends only on (seed, epoch, shuffle_rows, the
  store's chunking), so every device sees the same batches. Memory stays within `streaming_bytes`, which the plan
  requires to fit the budget.

Both modes give byte-identical runs on the CPU and resume exactly after a kill (the order depends only on the seed
and the epoch). The mode used changes the batches, so it is part of the training fingerprint (`FeedPlan.identity`).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pipeline.store import Store
from pipeline.training.options import BATCHES_IN_FLIGHT, TrainSettings, memory_bytes

log = logging.getLogger(__name__)

#: batches the streaming reader keeps ready ahead of the steps (plus two in use: `BATCHES_IN_FLIGHT` in all)
QUEUED_BATCHES = BATCHES_IN_FLIGHT - 2
#: chunks read per task of the thread pool (about 4 MiB at the stores' 2 MiB chunks)
CHUNKS_PER_READ = 2


@dataclass(frozen=True)
class FeedPlan:
    """How a stage feeds its training split: `mode` ("resident", "streaming", or "none" for a model that makes no
    optimiser steps), the memory `budget` (bytes) and the bytes the data needs (`needed`: the split when resident,
    `streaming_bytes` when streaming), the streaming shuffle window `window_chunks` (chunks; 0 when resident) and
    `why`, one line for the log."""

    mode: str
    budget: int
    needed: int
    window_chunks: int
    why: str

    @property
    def identity(self) -> dict[str, Any]:
        """What of the plan changes the batches (for the training fingerprint): the mode and streaming's window."""
        return {"mode": self.mode} | ({"window_chunks": self.window_chunks} if self.mode == "streaming" else {})


def free_memory(device: torch.device) -> int:
    """Free bytes on `device`: GPU memory on a GPU (torch's own cache counts as free), available RAM otherwise."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    import psutil

    return int(psutil.virtual_memory().available)


def streaming_bytes(window_rows: int, batch_size: int, row_bytes: int) -> int:
    """Peak bytes of the streaming reader (`Store.shuffled_batches` in a background thread): its two window buffers
    (rows gathered, rows permuted, each with room for a batch's leftover), the chunks of the next window read ahead,
    and the batches in flight (queued, and the two in use)."""
    return (3 * window_rows + (BATCHES_IN_FLIGHT + 2) * batch_size) * row_bytes


def plan_feed(settings: TrainSettings, n_rows: int, row_bytes: int, chunk_rows: int, device: torch.device, free: int | None = None) -> FeedPlan:
    """The feed of a training split of `n_rows` rows of `row_bytes` bytes each, stored in chunks of `chunk_rows` rows,
    on `device` (`free`: its free bytes, measured when None). ValueError, one line naming the setting, when the
    data or the budget cannot hold a batch, or the mode asked for does not fit the budget."""
    if n_rows < 1:
        raise ValueError("the training split is empty: nothing to train on")
    if settings.batch_size > n_rows:
        raise ValueError(f"train.batch_size: {settings.batch_size} rows per step, but the training split has only {n_rows} rows")
    fraction = not isinstance(settings.feed_memory, str)
    budget = memory_bytes(settings.feed_memory, (free_memory(device) if free is None else free) if fraction else 0)
    where = f"{budget / 2**20:,.0f} MiB ({settings.feed_memory:g} of the free memory of {device})" if fraction else f"{settings.feed_memory}"
    split = n_rows * row_bytes
    window_chunks = max(1, -(-min(settings.shuffle_rows, n_rows) // chunk_rows))
    stream = streaming_bytes(window_chunks * chunk_rows, settings.batch_size, row_bytes)
    if settings.batch_size * row_bytes * BATCHES_IN_FLIGHT > budget:
        raise ValueError(f"train.batch_size: {BATCHES_IN_FLIGHT} batches in flight of {settings.batch_size} rows of {row_bytes} bytes "
                         f"do not fit train.feed_memory = {where}")
    mode = settings.feed if settings.feed != "auto" else ("resident" if split <= budget else "streaming")
    if mode == "resident":
        if split > budget:
            raise ValueError(f"train.feed: resident needs the training split in memory ({split / 2**20:,.0f} MiB) but train.feed_memory "
                             f"allows {where}; use feed: streaming (or auto) or a larger feed_memory")
        return FeedPlan("resident", budget, split, 0, f"resident: the training split ({split / 2**20:,.0f} MiB) within {where}")
    if stream > budget:
        raise ValueError(f"train.shuffle_rows: streaming windows of {window_chunks * chunk_rows} rows and batches of {settings.batch_size} "
                         f"need {stream / 2**20:,.0f} MiB, more than train.feed_memory = {where}; lower shuffle_rows or batch_size")
    why = "asked for" if settings.feed == "streaming" else f"the training split ({split / 2**20:,.0f} MiB) exceeds {where}"
    return FeedPlan("streaming", budget, stream, window_chunks, f"streaming ({why}): windows of {window_chunks} chunks, "
                    f"at most {stream / 2**20:,.0f} MiB")


def load_rows(store: Store, parts: dict[str, np.ndarray], device: torch.device, threads: int | None = None) -> dict[str, Tensor]:
    """The rows of each part (sorted int64 row ids of `store`) as float32 tensors (len, *row shape) on `device`,
    read in one pass over the chunks any part touches (a thread pool, each task scattering its chunks' rows into
    every part; to a GPU through page-locked buffers with non-blocking copies)."""
    for name, rows in parts.items():
        if len(rows) and (np.any(np.diff(rows) <= 0) or rows[0] < 0 or rows[-1] >= len(store)):
            raise ValueError(f"{name}: row ids must be sorted, distinct and within the {len(store)} rows of {store.path}")
    shape = store.shape[1:]
    host = device.type == "cpu"
    out = {name: torch.empty((len(rows), *shape), dtype=torch.float32, device=device) for name, rows in parts.items()}
    views = {name: tensor.numpy() for name, tensor in out.items()} if host else {}
    touched = np.unique(np.concatenate([rows // store.chunk_rows for rows in parts.values()] + [np.zeros(0, np.int64)]))
    ranges = touched_ranges(touched, store.chunk_rows, len(store))

    def scatter(start: int, block: np.ndarray) -> None:
        for name, rows in parts.items():
            lo, hi = np.searchsorted(rows, [start, start + len(block)])
            if hi > lo and host and block.dtype == np.float32:
                # mode="clip": the ids are within the block by construction, and the default "raise" makes numpy
                # gather into a temporary buffer first (1.6 s of allocation and page faults across two threads
                # for a 490 MB split, against 0.3 s without)
                np.take(block, rows[lo:hi] - start, axis=0, out=views[name][lo:hi], mode="clip")
            elif hi > lo and host:
                views[name][lo:hi] = block[rows[lo:hi] - start]
            elif hi > lo:
                picked = torch.from_numpy(np.ascontiguousarray(block[rows[lo:hi] - start], dtype=np.float32))
                out[name][lo:hi].copy_(picked.pin_memory(), non_blocking=True)

    for _ in store.read_ranges(ranges, threads, apply=scatter):
        pass
    return out


def touched_ranges(chunks: np.ndarray, chunk_rows: int, n: int) -> list[tuple[int, int]]:
    """Row ranges covering the sorted distinct chunk indices `chunks` (of a store of n rows): runs of consecutive
    chunks of at most `CHUNKS_PER_READ` each, the tasks of the reading pool (no chunk read twice, none untouched)."""
    runs: list[list[int]] = []
    for c in chunks.tolist():
        if runs and c == runs[-1][1] and c - runs[-1][0] < CHUNKS_PER_READ:
            runs[-1][1] = c + 1
        else:
            runs.append([c, c + 1])
    return [(lo * chunk_rows, min(hi * chunk_rows, n)) for lo, hi in runs]


def in_background(batches: Iterator[np.ndarray], device: torch.device, depth: int = QUEUED_BATCHES) -> Iterator[Tensor]:
    """`batches` produced by a background thread, `depth` ahead of the caller, as float32 tensors (page-locked when
    `device` is a GPU, so the loop's copy is asynchronous). The order is `batches`' own. A reader error is raised
    in the caller; a caller that stops early stops the thread."""
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def tensor(batch: np.ndarray) -> Tensor:
        t = torch.from_numpy(np.ascontiguousarray(batch, dtype=np.float32))
        return t.pin_memory() if device.type == "cuda" else t

    def produce() -> None:
        try:
            for batch in batches:
                item = tensor(batch)
                while not stop.is_set():
                    try:
                        ready.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            ready.put(done)
        except BaseException as error:  # handed to the caller
            ready.put(error)
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # the reader's own threads, when the caller stopped early

    thread = threading.Thread(target=produce, name="train-feed", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                ready.get_nowait()
            except queue.Empty:
                thread.join(0.05)


def streaming_batches(store: Store, rows: np.ndarray, batch_size: int, seed: int, window_chunks: int, device: torch.device,
                      threads: int | None = None) -> Callable[[int], Iterator[Tensor]]:
    """A BatchSource streaming `rows` of `store` (see the module docstring): `Store.shuffled_batches`' order, read
    one window ahead by a thread pool, produced in a background thread."""
    source = store.shuffled_batches(batch_size, seed, rows=rows, buffer_chunks=window_chunks, threads=threads or os.cpu_count())
    return lambda epoch: in_background(source(epoch), device)
