"""How many threads a metric may use (the CPU budget the process was given, not the machine's core count), and
mapping a function over items on that many threads.

A stage that runs beside others (`cedar flow` on a shared node, a batch job with 2 of 64 cores) gets its share
through OMP_NUM_THREADS, the variable torch and BLAS read; without it, the cores this process may run on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")


def available_threads() -> int:
    """OMP_NUM_THREADS when it is set to a positive int, else the CPUs this process may run on (at least 1)."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def thread_map(function: Callable[[T], R], items: Iterable[T], jobs: int | None = None) -> list[R]:
    """[function(item) for item in items], in order, on `jobs` threads (default `available_threads()`; one: no
    pool). Worth it where `function` spends its time without the GIL (scipy's sparse products, torch's operations).

    The workers share the budget: each one's torch operations run on `available_threads() // jobs` threads (at least
    one; torch's thread count is per calling thread, so the caller's is unchanged). Left at the budget, every worker
    would start that many threads for each operation, more than there are cores: FMS's two blocks on 2 cores
    took 4.4 s instead of 3.9-4.3 s (bench/bench_evaluate.py's TopK cell)."""
    items = list(items)
    budget = available_threads()
    jobs = min(budget if jobs is None else jobs, len(items))
    if jobs <= 1:
        return [function(item) for item in items]
    share = max(1, budget // jobs)
    with ThreadPoolExecutor(max_workers=jobs, initializer=torch.set_num_threads, initargs=(share,)) as pool:
        return list(pool.map(function, items))
