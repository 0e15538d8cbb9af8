"""How many threads a metric may use: the CPU budget the process was given, not the machine's core count.

A stage that runs beside others (`cedar flow` on a shared node, a batch job with 2 of 64 cores) gets its share
through OMP_NUM_THREADS, the variable torch and BLAS read; without it, the cores this process may run on.
"""

from __future__ import annotations

import os


def available_threads() -> int:
    """OMP_NUM_THREADS when it is set to a positive int, else the CPUs this process may run on (at least 1)."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
