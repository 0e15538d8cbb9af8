"""What the flow's Dask workers log as they close: nothing alarming at the end of a flow that succeeded.

distributed's `Worker.close` stops the worker's heartbeat callback and later closes its connections to the scheduler;
a heartbeat that is already waiting for the scheduler's answer then fails ("Stream is closed") and the worker logs
"Failed to communicate with scheduler during heartbeat." at ERROR with a traceback, on the console of a flow whose
stages all succeeded (distributed's own shutdown race: seen in 1 of 40 closes of a 2-process `LocalCluster` on a
loaded 2-core machine, and once in CI at the end of a `cedar flow`). `QuietClose`, a worker plugin that
`flow.cluster.open_cluster` registers on every cluster (workers that join later get it too), drops exactly that
message while the worker that could have logged it is closing; from a running worker (a scheduler that went away)
it still shows.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from distributed import WorkerPlugin
from distributed.core import Status

#: the message distributed's `Worker.heartbeat` logs when its request to the scheduler fails
HEARTBEAT_FAILED = "Failed to communicate with scheduler during heartbeat."
#: a worker in one of these states is on its way out: its heartbeat failing is part of closing
CLOSING = frozenset({Status.closing, Status.closing_gracefully, Status.closed})


class _DuringClose(logging.Filter):
    """Drops HEARTBEAT_FAILED while a worker of this process is closing. A log record does not say which worker
    logged it, so where several workers share a process (a `local` cluster of threads) one closing worker is enough;
    there they all close together, at the end of the flow."""

    def __init__(self) -> None:
        super().__init__()
        self.workers: weakref.WeakSet[Any] = weakref.WeakSet()

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == HEARTBEAT_FAILED and any(worker.status in CLOSING for worker in self.workers))


#: the one filter of this process (on distributed.worker's logger once a worker here has the plugin)
DURING_CLOSE = _DuringClose()


class QuietClose(WorkerPlugin):
    """Registers its worker with DURING_CLOSE. Nothing is undone at teardown on purpose: `Worker.close` tears its
    plugins down before it closes the connections, i.e. before the message this plugin is for."""

    name = "cedar-quiet-close"

    def setup(self, worker: Any) -> None:
        DURING_CLOSE.workers.add(worker)
        logging.getLogger("distributed.worker").addFilter(DURING_CLOSE)  # adding the same filter twice is a no-op
