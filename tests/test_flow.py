"""The Prefect flow runs the same stage functions as DVC, for real, on the tiny preset (no server, no network)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.scratch import env, scratch_copy

pytestmark = pytest.mark.slow


def test_prefect_flow_runs_every_stage_and_writes_the_report(tmp_path):
    repo = scratch_copy(tmp_path)
    e = env()
    e.update(PREFECT_HOME=str(repo / ".prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1",
             PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120")
    e.pop("PREFECT_API_URL", None)
    result = subprocess.run([sys.executable, "-m", "stages.cli", "flow", "--workers", "2"], cwd=repo, env=e,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert (repo / "reports" / "index.html").is_file()
    for run in ["cedar-4", "topk-32-4"]:
        metrics = json.loads((repo / "store" / "eval" / run / "metrics.json").read_text())
        assert 0 <= metrics["trained"]["fvu"] < 1
