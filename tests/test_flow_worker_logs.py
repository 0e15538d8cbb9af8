"""A cluster the flow opens closes without logging distributed's heartbeat race as an error (flow.worker_logs):
the race forced (the scheduler answers heartbeats late, so one is in flight when the workers close), with a bare
LocalCluster as the control that shows it happening, and the filter's rule on hand-made records."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from distributed.core import Status

from flow.worker_logs import HEARTBEAT_FAILED, _DuringClose

ROOT = Path(__file__).resolve().parents[1]

#: a cluster whose scheduler answers every heartbeat 0.4 s late (they come every 0.5 s), used for a second and closed
CLOSE_DURING_A_HEARTBEAT = """
import asyncio, sys, time
from contextlib import contextmanager
from pathlib import Path
from distributed import Client, LocalCluster
from flow.cluster import LocalSettings, open_cluster

@contextmanager
def opened(by, processes):
    if by == "flow":
        with open_cluster(LocalSettings(workers=2, processes=processes, dashboard=None), Path("."), "test") as (client, _):
            yield client
    else:
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=processes, dashboard_address=None) as cluster, Client(cluster) as client:
            yield client

def slow_heartbeats(cluster):
    answer = cluster.scheduler.handlers["heartbeat_worker"]
    async def late(*args, **kwargs):
        await asyncio.sleep(0.4)
        return answer(*args, **kwargs)
    cluster.scheduler.handlers["heartbeat_worker"] = late

if __name__ == "__main__":
    with opened(sys.argv[1], sys.argv[2] == "processes") as client:
        slow_heartbeats(client.cluster)
        assert client.submit(sum, [1, 2]).result() == 3
        time.sleep(1.5)
"""


def close_during_a_heartbeat(tmp_path: Path, opened_by: str, workers: str) -> str:
    script = tmp_path / "close.py"
    script.write_text(CLOSE_DURING_A_HEARTBEAT)
    done = subprocess.run([sys.executable, str(script), opened_by, workers], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


@pytest.mark.parametrize("workers", ["processes", "threads"])
def test_a_flow_cluster_closing_during_a_heartbeat_logs_no_error(tmp_path, workers):
    control = close_during_a_heartbeat(tmp_path, "bare", workers)
    assert HEARTBEAT_FAILED in control and "ERROR" in control, "the control did not hit the race: the test proves nothing"
    quiet = close_during_a_heartbeat(tmp_path, "flow", workers)
    assert "ERROR" not in quiet and "Traceback" not in quiet, quiet[-3000:]


class Worker:
    def __init__(self, status: Status) -> None:
        self.status = status


def record(message: str) -> logging.LogRecord:
    return logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1, message, None, None)


def test_only_the_heartbeat_message_of_a_closing_worker_is_dropped():
    rule = _DuringClose()
    running = Worker(Status.running)
    rule.workers.add(running)
    assert rule.filter(record(HEARTBEAT_FAILED)), "a running worker's failed heartbeat (its scheduler went away) shows"
    for status in (Status.closing, Status.closing_gracefully, Status.closed):
        running.status = status
        assert not rule.filter(record(HEARTBEAT_FAILED)), status
        assert rule.filter(record("Unexpected exception during heartbeat. Closing worker.")), "other errors show"

