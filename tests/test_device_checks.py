"""bench/device_checks.sh, the GPU checks of one device lease, run at toy sizes on this machine (SMALL=1): every step
ends well and writes what it is read for, so that a lease is not spent finding a broken script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_device_checks_run_every_step_and_keep_their_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "SMALL": "1", "PYTHON": sys.executable}
    # OUT_DIR relative to the caller's directory, not the repository root the steps run from
    done = subprocess.run(["bash", str(ROOT / "bench" / "device_checks.sh"), "out"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split()[:2] for line in summary] == [["device", "rc=0"], ["evaluate", "rc=0"], ["tests", "rc=0"], ["smoke", "rc=0"]], summary
    assert "cuda available:" in (out / "device.log").read_text()
    cells = [json.loads(line) for line in (out / "evaluate.log").read_text().splitlines() if line.startswith('{"cell"')]
    assert [c["cell"].split("-")[0] for c in cells] == ["topk", "cedar"]
    for cell in cells:
        assert len(cell["evaluate_s"]) == 2 and cell["timings"]["fms"] > 0 and cell["ratio"] > 0
    assert " passed" in (out / "tests.log").read_text()
    phases = {json.loads(line)["phase"] for line in (out / "smoke.log").read_text().splitlines() if line.startswith("{")}
    assert phases == {"extract", "train_sae", "evaluate_sae", "train_cedar", "evaluate_cedar"}


def test_device_checks_fail_when_a_step_runs_past_its_limit_and_still_run_the_others(tmp_path: Path) -> None:
    env = {**os.environ, "SMALL": "1", "PYTHON": sys.executable, "LIMIT_EVALUATE": "1", "LIMIT_TESTS": "1", "LIMIT_SMOKE": "1"}
    done = subprocess.run(["bash", str(ROOT / "bench" / "device_checks.sh"), str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout
    summary = [line.split()[:2] for line in (tmp_path / "summary.txt").read_text().splitlines()]
    assert summary == [["device", "rc=0"], ["evaluate", "rc=124"], ["tests", "rc=124"], ["smoke", "rc=124"]], summary
