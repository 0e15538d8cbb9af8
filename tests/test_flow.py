"""`cedar flow` end to end on the tiny preset, against `dvc repro` (tests/conftest.py `tiny_pristine` and `tiny_repro`: the same commit):
a real `distributed.LocalCluster` of 2 worker processes, Prefect's temporary local server, DVC's lock.

Each flow is the `cedar` command in a subprocess; every process it starts is watched (psutil) while it runs, so a
test can kill a worker in the middle of a stage and check that nothing is left running afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil
import pytest
import yaml

from tests.scratch import copy_repo, dvc, env, stable_lock

pytestmark = pytest.mark.slow
CLUSTERS = {"two": {"kind": "local", "workers": 2, "processes": True, "dashboard": None}}


@dataclass
class FlowRun:
    returncode: int
    stdout: str
    stderr: str
    started: dict[int, str] = field(default_factory=dict)  # pid -> command line of every process the flow started
    left: list[str] = field(default_factory=list)  # those still running after it exited

    @property
    def ran(self) -> list[str]:
        return sorted({line.split("'")[1] for line in self.stdout.splitlines() if line.startswith("Running stage")})


def cedar(repo: Path, *args: str, during: Callable[[list[psutil.Process]], None] | None = None, logging: str = "WARNING") -> FlowRun:
    """`cedar ARGS` in `repo` on the two-process cluster, offline (Prefect's temporary server; its console at level
    `logging`); `during` sees the processes it has started every 50 ms while it runs."""
    clusters = repo.parent / f"{repo.name}-cluster.yaml"
    clusters.write_text(yaml.safe_dump(CLUSTERS))
    e = env()
    e.pop("PREFECT_API_URL", None)
    e.pop("SHELL", None)  # DVC's shell is then /bin/sh, as on a batch node; dash forks the stage's command
    e["PREFECT_LOGGING_LEVEL"] = logging
    command = [sys.executable, "-m", "cli", *args]
    if args[0] == "flow":
        command += ["--cluster", "two", "--cluster-file", str(clusters)]
    proc = subprocess.Popen(command, cwd=repo, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started: dict[int, tuple[float, str]] = {}
    outputs: dict[str, str] = {}

    def read(name: str, stream) -> None:
        outputs[name] = stream.read()

    readers = [threading.Thread(target=read, args=item) for item in (("stdout", proc.stdout), ("stderr", proc.stderr))]
    for reader in readers:
        reader.start()
    deadline = time.time() + 1200
    while proc.poll() is None and time.time() < deadline:
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            break
        for child in children:
            try:  # the latest command line: a child is first a copy of its parent, then what it executes (an exited one has none)
                if cmdline := " ".join(child.cmdline()):
                    started[child.pid] = (child.create_time(), cmdline)
            except psutil.Error:
                pass
        if during is not None:
            during(children)
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for reader in readers:
        reader.join()
    stdout, stderr = outputs["stdout"], outputs["stderr"]
    time.sleep(1)  # let the last children exit
    left = [cmd for pid, (created, cmd) in started.items() if alive(pid, created)]
    return FlowRun(proc.returncode, stdout, stderr, {pid: cmd for pid, (_, cmd) in started.items()}, left)


def alive(pid: int, created: float) -> bool:
    try:
        process = psutil.Process(pid)
        return process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


lock = stable_lock


@pytest.fixture(scope="module")
def reference(tiny_repro, tmp_path_factory) -> Path:
    """A copy of the session's `dvc repro` for this module to change as it changes the flow's project."""
    return copy_repo(tiny_repro, tmp_path_factory.mktemp("reference") / "repo")


@pytest.fixture(scope="module")
def flowed(tiny_pristine, tmp_path_factory) -> tuple[Path, FlowRun]:
    """The pristine project after one `cedar flow`, and that run."""
    repo = copy_repo(tiny_pristine, tmp_path_factory.mktemp("flow") / "repo")
    return repo, cedar(repo, "flow")


def test_the_flow_runs_every_stage_and_computes_what_dvc_repro_computes(flowed, tiny_repro):
    repo, run = flowed
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    assert run.ran == sorted(lock(tiny_repro))
    assert lock(repo) == lock(tiny_repro), "every stage's deps, params and outputs hash the same under DVC"
    for cell in ["cedar-4", "topk-32-4"]:
        metrics = (repo / "store" / "eval" / cell / "metrics.json").read_text()
        assert metrics == (tiny_repro / "store" / "eval" / cell / "metrics.json").read_text()
        assert 0 <= json.loads(metrics)["trained"]["fvu"] < 1
    assert dvc(repo, "status").strip() == "Data and pipelines are up to date."


def test_nothing_is_left_running_and_the_logs_hold_no_errors(flowed):
    _, run = flowed
    assert run.left == []
    assert sum("uvicorn" in cmd for cmd in run.started.values()) == 1, "one Prefect server: the flow's, none on the workers"
    assert sum(cmd.split()[1:3] == ["-m", "stages.cell"] for cmd in run.started.values()) == 2, "each cell once"
    for word in ("ERROR", "Traceback", "EventsWorker"):
        assert word not in run.stderr, run.stderr[-5000:]


def test_the_flow_publishes_the_report_and_the_metrics_as_prefect_artifacts(flowed):
    repo, _ = flowed
    with sqlite3.connect(repo / ".prefect" / "prefect.db") as db:
        artifacts = {key: (kind, data) for key, kind, data in db.execute("select key, type, data from artifact")}
    assert artifacts["cedar-report"][0] == "markdown" and (repo / "reports" / "index.html").resolve().as_uri() in artifacts["cedar-report"][1]
    kind, table = artifacts["cedar-metrics"]
    rows = json.loads(json.loads(table)) if kind == "table" else None
    assert sorted(row["run"] for row in rows) == ["cedar-4", "topk-32-4"] and all(0 <= row["fvu"] < 1 for row in rows)


def test_up_to_date_means_the_same_to_the_flow_and_to_dvc_repro(flowed, tiny_repro):
    repo, _ = flowed
    again = cedar(repo, "flow")
    assert again.returncode == 0 and again.ran == [] and "up to date" in again.stdout
    assert not any("uvicorn" in cmd for cmd in again.started.values()), "nothing to run: no Prefect server, no cluster"
    assert cedar(repo, "flow", "--dry").stdout == ""
    assert "Running stage" not in dvc(repo, "repro")
    after_repro = cedar(tiny_repro, "flow", "--dry")
    assert after_repro.returncode == 0 and after_repro.stdout == ""


def edit(params: Path, change: Callable[[dict], None]) -> None:
    values = yaml.safe_load(params.read_text())
    change(values)
    params.write_text(yaml.safe_dump(values, sort_keys=False))


def test_a_new_k_runs_exactly_its_cell_and_the_report_as_dvc_repro_does(flowed, reference):
    """One more value in sweep.sae.ks: `cedar flow --dry` names what `dvc status` names, the flow runs exactly that
    and writes what `dvc repro` writes."""
    repo, _ = flowed
    for project in (repo, reference):
        edit(project / "params.yaml", lambda p: p["sweep"]["sae"]["ks"].append(8))
    planned = cedar(repo, "flow", "--dry").stdout.split()
    assert planned == ["sae@topk-32-8", "report"]
    assert sorted(planned) == sorted(json.loads(dvc(repo, "status", "--json")))
    run = cedar(repo, "flow")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    assert run.ran == sorted(planned) == sorted(line.split("'")[1] for line in dvc(reference, "repro").splitlines() if line.startswith("Running stage"))
    assert lock(repo) == lock(reference)


def test_a_worker_killed_while_it_trains_a_cell_is_retried_and_the_cell_resumes(flowed, reference):
    """SIGKILL of the worker process while it trains rotation@cedar-4 (longer training, so that there is a while):
    the stage is retried on a new worker, resumes from its epoch checkpoint and ends with the outputs of an
    undisturbed `dvc repro`; its dvc.lock entry stays the old one until then."""
    repo, _ = flowed
    for project in (repo, reference):
        edit(project / "params.yaml", lambda p: p["methods"]["cedar"]["train"].update(epochs=150, patience=150))
    assert cedar(repo, "flow", "--dry").stdout.split() == ["rotation@cedar-4", "planted", "report"]  # planted reads methods
    before = lock(repo)["rotation@cedar-4"]
    killed: list[bool] = []

    def kill_the_worker_training_the_cell(processes: list[psutil.Process]) -> None:
        if killed or not (repo / "store" / "models" / "cedar-4.tmp" / "resume.json").exists():
            return
        for process in processes:
            try:
                if process.cmdline()[1:5] == ["-m", "stages.cell", "--method", "cedar"]:
                    worker = next(p for p in process.parents() if "multiprocessing" in " ".join(p.cmdline()))
                    killed.append(lock(repo)["rotation@cedar-4"] == before)
                    os.kill(worker.pid, signal.SIGKILL)
                    return
            except psutil.Error:
                pass

    run = cedar(repo, "flow", during=kill_the_worker_training_the_cell, logging="INFO")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    assert killed == [True], "killed once, while training, before the stage was recorded"
    assert run.stdout.count("Running stage 'rotation@cedar-4'") == 2 and run.ran == ["planted", "report", "rotation@cedar-4"]
    assert "cedar: resuming after epoch" in run.stderr, "the retry went on from the last epoch checkpoint"
    assert run.left == []
    dvc(reference, "repro")
    assert lock(repo) == lock(reference), "the interrupted cell ends as an undisturbed run's"
    assert "Running stage" not in dvc(repo, "repro")


def test_a_flow_stopped_with_sigterm_exits_cleanly_and_a_rerun_finishes_its_work(flowed, reference):
    """SIGTERM to the flow's process (a batch system's stop) while a cell runs: the flow exits with 143 through its
    exit handlers, so the cluster, the stage and Prefect's temporary server are gone; nothing half-done is
    recorded, and the next flow runs what was left and ends as `dvc repro` does."""
    repo, _ = flowed
    for project in (repo, reference):
        edit(project / "params.yaml", lambda p: p["sweep"]["sae"]["ks"].append(2))
    stopped: list[int] = []

    def stop_the_flow_while_a_cell_runs(processes: list[psutil.Process]) -> None:
        for process in processes:
            try:
                if not stopped and process.cmdline()[1:3] == ["-m", "stages.cell"]:
                    driver = next(p for p in process.parents() if p.cmdline()[1:3] == ["-m", "cli"])
                    os.kill(driver.pid, signal.SIGTERM)
                    stopped.append(driver.pid)
            except psutil.Error:
                pass

    run = cedar(repo, "flow", during=stop_the_flow_while_a_cell_runs)
    assert stopped and run.returncode == 143, run.stderr[-3000:]
    assert run.left == [], "no worker, stage or Prefect server outlives the flow"
    assert "sae@topk-32-2" not in lock(repo)
    again = cedar(repo, "flow")
    assert again.returncode == 0 and again.ran == ["report", "sae@topk-32-2"], again.stderr[-3000:]
    dvc(reference, "repro")
    assert lock(repo) == lock(reference)
