"""`cedar flow` on a real SLURM: the tiny pipeline as batch jobs of one CPU through the shipped SLURM entry of
cluster.yaml, against the session's `dvc repro`, byte for byte; one job cancelled (scancel) in the middle of a
grid cell; the GPU stages scheduled through a GRES; a partition, GRES or size SLURM refuses, before anything starts
and at run time.

SLURM is the one-node cluster of `.ci/slurm` (task/affinity, fake GPUs as a GRES): the one SLURM_CONF names
(`.ci/run` starts it before the tests and stops it after), else one these tests start and stop themselves (as
root, with slurm-wlm and munge installed). Where neither works the tests are skipped, saying why. That jobs were
really submitted is read from SLURM itself: `squeue` while the flow runs, the job ids in the names of the job logs,
SLURM's record of finished jobs (jobcomp), and `SLURM_JOB_ID` in the environment of the stage processes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import yaml

from tests.scratch import copy_repo, env, outputs, stable_lock

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
ROOT = Path(__file__).resolve().parents[1]


def sinfo(*args: str) -> str:
    return subprocess.run(["sinfo", "-h", *args], capture_output=True, text=True, timeout=30, check=True).stdout.strip()


def slurm_answers() -> bool:
    try:
        return bool(sinfo("-o", "%R"))
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.fixture(scope="session")
def slurm(tmp_path_factory) -> dict[str, str]:
    """The partition, its GPUs and SLURM's config of a SLURM that takes jobs (see the module docstring)."""
    started = None
    if not (os.environ.get("SLURM_CONF") and slurm_answers()):
        if shutil.which("slurmctld") is None or shutil.which("munged") is None:
            pytest.skip("slurm-wlm and munge are not installed here (`.ci/slurm install` installs them with apt; .ci/run does)")
        if os.geteuid() != 0:
            pytest.skip("SLURM's daemons run jobs as their users, so they must be started as root; this is not root")
        started = tmp_path_factory.mktemp("slurm")
        result = subprocess.run([str(ROOT / ".ci" / "slurm"), "start", str(started)], capture_output=True, text=True, timeout=180)
        if result.returncode != 0:
            pytest.skip(f"SLURM could not be started here: {' | '.join(result.stderr.strip().splitlines()[-3:])}")
        os.environ["SLURM_CONF"] = str(started / "slurm.conf")
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    jobcomp = re.search(r"^JobCompLoc\s*=\s*(\S+)", config, re.M)
    yield {"partition": sinfo("-o", "%R").split()[0], "gres": sinfo("-o", "%G"), "task_plugin": re.search(r"^TaskPlugin\s*=\s*(\S+)", config, re.M)[1],
           "jobcomp": jobcomp[1] if jobcomp else ""}
    if started is not None:
        subprocess.run([str(ROOT / ".ci" / "slurm"), "stop", str(started)], check=True, timeout=60)
        del os.environ["SLURM_CONF"]


def ci_entry(slurm: dict[str, str], **changes: object) -> dict:
    """The shipped `slurm-gpu` entry of cluster.yaml on the CI node: its partition, jobs of one CPU and 2 GiB, no
    account (the node has no accounting) and no venv to activate (the jobs inherit the test's environment)."""
    entry = yaml.safe_load((ROOT / "cluster.yaml").read_text())["slurm-gpu"]
    del entry["account"]
    entry.update({"queue": slurm["partition"], "job_cpu": 1, "memory": "2GiB", "walltime": "00:30:00", "job_script_prologue": [], "max_jobs": 2,
                  **changes})
    return entry


def write_clusters(repo: Path, **entries: dict) -> Path:
    path = repo.parent / "clusters.yaml"
    path.write_text(yaml.safe_dump(entries))
    return path


def squeue() -> list[dict[str, str]]:
    out = subprocess.run(["squeue", "-h", "-o", "%i|%T|%C|%b|%P|%j"], capture_output=True, text=True).stdout
    return [dict(zip(["id", "state", "cpus", "gres", "partition", "name"], line.split("|"))) for line in out.splitlines() if line.strip()]


@dataclass
class Watched:
    jobs: dict[str, dict[str, str]] = field(default_factory=dict)  # job id -> its squeue row (the last seen)
    stages: dict[int, dict] = field(default_factory=dict)  # pid of a stage process -> what it ran with
    cancelled: dict[str, str] = field(default_factory=dict)  # the cell whose job was cancelled -> that job's id


def watch(watched: Watched, repo: Path, stop: threading.Event) -> None:
    """Every 0.2 s: SLURM's queue, the stage processes (their job, GPUs and CPUs), and once a grid cell trains in a
    job, `scancel` of that job."""
    while not stop.wait(0.2):
        for row in squeue():
            watched.jobs[row["id"]] = row
        for process in psutil.process_iter(["pid", "cmdline"]):
            cmdline = process.info["cmdline"] or []
            if cmdline[1:2] != ["-m"] or not cmdline[2:3] or not cmdline[2].startswith("stages."):
                continue
            try:
                environ, cpus = process.environ(), process.cpu_affinity()
            except psutil.Error:
                continue
            if "SLURM_JOB_ID" not in environ:
                continue
            watched.stages.setdefault(process.pid, {"stage": cmdline[2], "job": environ["SLURM_JOB_ID"], "gpus": environ.get("CUDA_VISIBLE_DEVICES"),
                                                    "cpus": len(cpus)})
            cell = f"{cmdline[cmdline.index('--method') + 1]}-{cmdline[cmdline.index('--k') + 1]}" if cmdline[2] == "stages.cell" else None
            if cell and not watched.cancelled and (repo / "store" / "models" / f"{cell}.tmp" / "resume.json").exists():
                subprocess.run(["scancel", environ["SLURM_JOB_ID"]], check=True)
                watched.cancelled[cell] = environ["SLURM_JOB_ID"]


lock = stable_lock


def test_the_tiny_pipeline_as_slurm_jobs_of_one_cpu_survives_a_scancel_and_writes_what_dvc_repro_writes(slurm, tiny_pristine, tiny_repro, tmp_path):
    """The flow's shell says OMP_NUM_THREADS=2 and its jobs have one CPU each; the session's `dvc repro` ran with
    OMP_NUM_THREADS=1 on every CPU. Every file is the same, because the stages take params' `threads`."""
    assert slurm["task_plugin"] == "task/affinity"
    repo = copy_repo(tiny_pristine, tmp_path / "repo")
    edit = yaml.safe_load((repo / "params.yaml").read_text())
    edit["methods"]["cedar"]["train"].update(epochs=150, patience=150)  # a cell long enough to be cancelled while it trains
    (repo / "params.yaml").write_text(yaml.safe_dump(edit, sort_keys=False))
    reference = copy_repo(tiny_repro, tmp_path / "reference")
    (reference / "params.yaml").write_text((repo / "params.yaml").read_text())
    subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=reference, env=env(), check=True, capture_output=True, timeout=1200)
    clusters = write_clusters(repo, ci=ci_entry(slurm))
    shell = {**env(), "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "PREFECT_LOGGING_LEVEL": "WARNING"}
    shell.pop("PREFECT_API_URL", None)
    watched, stop = Watched(), threading.Event()
    watcher = threading.Thread(target=watch, args=(watched, repo, stop), daemon=True)
    watcher.start()
    try:
        run = subprocess.run([sys.executable, "-m", "cli", "flow", "--cluster", "ci", "--cluster-file", str(clusters)], cwd=repo, env=shell,
                             capture_output=True, text=True, timeout=2400)
    finally:
        stop.set()
        watcher.join()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    # the jobs: submitted to the partition, one CPU each, each with one of the fake GPUs, the cancelled one among them
    assert watched.jobs and {job["partition"] for job in watched.jobs.values()} == {slurm["partition"]}
    assert {job["cpus"] for job in watched.jobs.values()} == {"1"} and all("gpu:1" in job["gres"] for job in watched.jobs.values())
    logged = {re.fullmatch(r"dask-worker-(\d+)\.out", p.name)[1] for p in (repo / "logs" / "jobs").glob("dask-worker-*.out")}
    assert set(watched.jobs) <= logged, "every job's log is in the project's logs/jobs"
    finished = dict(re.findall(r"^JobId=(\d+) .*?JobState=(\S+)", Path(slurm["jobcomp"]).read_text(), re.M)) if slurm["jobcomp"] else {}
    assert set(watched.jobs) <= set(finished), "SLURM's record of finished jobs has every job"
    assert not [job for job in squeue() if job["id"] in watched.jobs], "the flow cancelled its jobs when it ended"
    # the stages ran inside the jobs, on one CPU, with a GPU of the GRES
    ran = {info["stage"] for info in watched.stages.values()}
    assert {"stages.encoder", "stages.extract", "stages.captions", "stages.cell", "stages.report"} <= ran
    assert {info["cpus"] for info in watched.stages.values()} == {1} and {info["job"] for info in watched.stages.values()} <= set(watched.jobs)
    assert all(info["gpus"] in ("0", "1") for info in watched.stages.values()), "CUDA_VISIBLE_DEVICES from the GRES"
    # the cancelled job: its cell ran again, in another job, and ended as an undisturbed run
    (cell, job), = watched.cancelled.items()
    stage = f"rotation@{cell}"
    assert finished[job] == "CANCELLED"
    assert run.stdout.count(f"Running stage '{stage}'") == 2, run.stdout
    assert len({info["job"] for info in watched.stages.values() if info["stage"] == "stages.cell"}) >= 2
    # the same bytes as dvc repro, and DVC agrees
    assert lock(repo) == lock(reference), "dvc.lock: the same hashes of every dep, param and output"
    assert outputs(repo) == outputs(reference)
    status = subprocess.run([sys.executable, "-m", "dvc", "status"], cwd=repo, env=env(), capture_output=True, text=True).stdout
    assert status.strip() == "Data and pipelines are up to date."


@pytest.mark.parametrize("change, message", [
    ({"queue": "nosuch"}, "invalid partition specified: nosuch"),
    ({"job_extra_directives": ["--gres=gpu:9"]}, "Requested node configuration is not available"),
    ({"job_cpu": 512}, "Requested node configuration is not available"),
])
def test_a_job_slurm_would_refuse_stops_the_flow_before_anything_starts_also_under_dry(slurm, tiny_pristine, tmp_path, capsys, change, message):
    from cli.main import main

    repo = copy_repo(tiny_pristine, tmp_path / "repo")
    clusters = write_clusters(repo, bad=ci_entry(slurm, **change))
    for dry in (["--dry"], []):
        start = time.monotonic()
        assert main(["flow", *dry, "--cluster", "bad", "--cluster-file", str(clusters), "--root", str(repo)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {clusters}: bad: `sbatch --test-only` refuses its job: ") and message in err and err.count("\n") == 1, err
        assert time.monotonic() - start < 30
    assert not (repo / "dvc.lock").exists() and not (repo / ".prefect").exists(), "nothing started"


RUN_THE_FLOW_UNCHECKED = """
import sys
from flow import configure_prefect_env
configure_prefect_env(sys.argv[1])
from flow.prefect_flow import FlowError, pipeline_flow
try:
    pipeline_flow(cluster="gone", cluster_file=sys.argv[2], root=sys.argv[1])
except FlowError as e:
    sys.exit(f"error: {e}")
"""


def test_a_partition_that_goes_away_after_the_check_stops_the_running_flow_with_sbatchs_message(slurm, tiny_pristine, tmp_path):
    """The flow itself, without the check before it (as if the partition went away after it): SLURM refuses the
    first job, and the flow stops within seconds with sbatch's message, recording nothing."""
    repo = copy_repo(tiny_pristine, tmp_path / "repo")
    clusters = write_clusters(repo, gone=ci_entry(slurm, queue="gone"))
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-c", RUN_THE_FLOW_UNCHECKED, str(repo), str(clusters)], cwd=repo, env=env(), capture_output=True, text=True,
                         timeout=600)
    seconds = time.monotonic() - started
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {clusters}: gone: the batch system refused a job: sbatch: error: invalid partition specified: gone"), run.stderr[-3000:]
    assert "0 of 9 stages finished" in last and not (repo / "dvc.lock").exists()
    print(f"refused and stopped in {seconds:.0f} s, Prefect's temporary server included")
