"""`cedar flow` at the size of a real sweep: 160 tiny DVC stages (generated, a few lines of Python each, so the test
costs DVC's and Prefect's bookkeeping, not computation) on a 2-worker local cluster. A flow that large runs
against the project's own Prefect server (started once, reused, stopped by `cedar server stop`), finishes, and
leaves `dvc status` clean; when that server dies in the middle of a flow, the flow says so in one line, every
stage still runs and is recorded in dvc.lock, and the process exits when they are done.

The flows run as `cedar` subprocesses (a flow that lost its API ends its process at once: os._exit).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from flow.server import LARGE_FLOW, project_server
from pipeline.presets import preset_text
from tests.scratch import env, git

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
CELLS = 80  # two stages per cell: 160 stages

STEP = '''import os, sys, time, yaml
name, out = sys.argv[1], sys.argv[2]
seed = yaml.safe_load(open("params.yaml"))["seed"]
time.sleep(float(open("sleep").read()) if os.path.exists("sleep") else 0.0)
inputs = [open(path).read() for path in sys.argv[3:]]
open(out, "w").write(f"{name} {seed} {len(inputs)}\\n")
'''


def sweep(tmp: Path) -> Path:
    """A git + DVC project of 2 x CELLS stages: `a@i` writes out/a-i.txt, `b@i` reads it and writes out/b-i.txt."""
    repo = tmp / "sweep"
    repo.mkdir()
    (repo / "step.py").write_text(STEP)
    cells = list(range(CELLS))
    stages = {"a": {"matrix": {"i": cells}, "cmd": "python step.py a${item.i} out/a-${item.i}.txt", "deps": ["step.py"],
                    "params": ["seed"], "outs": ["out/a-${item.i}.txt"]},
              "b": {"matrix": {"i": cells}, "cmd": "python step.py b${item.i} out/b-${item.i}.txt out/a-${item.i}.txt",
                    "deps": ["step.py", "out/a-${item.i}.txt"], "params": ["seed"], "outs": ["out/b-${item.i}.txt"]}}
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    (repo / "params.yaml").write_text(preset_text("tiny"))  # `cedar flow` checks it; the steps read only its seed
    (repo / "out").mkdir()
    (repo / "cluster.yaml").write_text(yaml.safe_dump({"local": {"kind": "local", "workers": 2, "dashboard": None}}))
    (repo / ".gitignore").write_text(".prefect/\n/logs/\nsleep\n")
    git(repo, "init", "-q")
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=repo, env=env(), check=True)
    git(repo, "add", "-A")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "sweep")
    return repo


def cedar_env() -> dict[str, str]:
    e = {**env(), "PYTHONPATH": str(ROOT), "PREFECT_LOGGING_LEVEL": "WARNING"}
    e.pop("PREFECT_API_URL", None)
    return e


def cedar(repo: Path, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args, "--root", str(repo)], cwd=repo, env=cedar_env(), capture_output=True, text=True,
                          timeout=timeout)


def dvc(repo: Path, *args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, env=env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def seeded(repo: Path, seed: int) -> int:
    """How many stages dvc.lock records with `seed` (read while DVC may be rewriting it)."""
    return sum(isinstance(stage, dict) and (stage.get("params") or {}).get("params.yaml", {}).get("seed") == seed for stage in lock(repo).values())


def lock(repo: Path) -> dict:
    """dvc.lock's stages ({} while there is none, or while DVC is rewriting it)."""
    try:
        return yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    except (OSError, yaml.YAMLError, TypeError, KeyError):
        return {}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    repo = sweep(tmp_path_factory.mktemp("scale"))
    yield repo
    cedar(repo, "server", "stop")


def test_a_sweep_of_160_stages_finishes_on_the_projects_prefect_server_and_dvc_agrees(project):
    assert CELLS * 2 > LARGE_FLOW
    start = time.monotonic()
    run = cedar(project, "flow")
    seconds = time.monotonic() - start
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Started this project's Prefect server for a flow of 160 stages" in run.stdout
    assert f"Ran {2 * CELLS} of {2 * CELLS} planned stages" in run.stdout, run.stdout[-2000:]
    assert len(lock(project)) == 2 * CELLS
    assert dvc(project, "status").strip() == "Data and pipelines are up to date."
    assert (project / "out" / f"b-{CELLS - 1}.txt").read_text() == f"b{CELLS - 1} 0 1\n"
    for word in ("Traceback", "ERROR", "EventsWorker"):
        assert word not in run.stderr, run.stderr[-3000:]
    print(f"160 stages: {seconds:.0f} s")
    url = project_server(project)
    assert url is not None, "the server stays up for later flows"
    again = cedar(project, "flow", "a@0")
    assert again.returncode == 0 and "up to date" in again.stdout


def test_a_flow_that_loses_its_prefect_api_finishes_its_stages_records_them_and_exits(project):
    """The project's server is killed (SIGKILL) while the flow runs: one line says so, the stages go on and are
    recorded, the process exits when they are done, and DVC sees nothing stale."""
    state = json.loads((project / ".prefect" / "server.json").read_text())
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["seed"] = 1
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (project / "sleep").write_text("0.5")
    flow = subprocess.Popen([sys.executable, "-m", "cli", "flow", "--root", str(project)], cwd=project, env=cedar_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 900
        while seeded(project, 1) < 10 and time.monotonic() < deadline:
            assert flow.poll() is None, flow.communicate()
            time.sleep(0.5)
        os.killpg(state["pid"], signal.SIGKILL)
        killed_with = seeded(project, 1)
        out, err = flow.communicate(timeout=1200)
    finally:
        if flow.poll() is None:
            flow.kill()
    assert flow.returncode == 0, out[-2000:] + err[-3000:]
    assert killed_with < 2 * CELLS, "the server was killed before the flow was done"
    lost = [line for line in err.splitlines() if "Prefect API" in line]
    assert len(lost) == 1 and lost[0].startswith(f"The Prefect API at {state['api_url']}") and "is lost" in lost[0], err[-3000:]
    assert err.strip().splitlines() == lost, f"nothing but that line on stderr:\n{err[-3000:]}"
    not_ran = [line for line in out.splitlines() if "skipping" in line]
    assert f"Ran {2 * CELLS} of {2 * CELLS} planned stages" in out, "\n".join(not_ran[:20]) + "\n" + out[-500:]
    assert seeded(project, 1) == len(lock(project)) == 2 * CELLS
    assert all((project / "out" / f"b-{i}.txt").read_text() == f"b{i} 1 1\n" for i in range(CELLS)), "outputs of the new seed"
    assert dvc(project, "status").strip() == "Data and pipelines are up to date."
    assert project_server(project) is None
