"""`cedar flow` on a toy DVC project: real DVC, real Prefect (in this process), real Dask clusters; stages of a few
lines of Python, so that planning, recording, concurrency, resources and faults are checked in seconds.

The toy graph: `a` (params seed, report) -> `b@4`, `b@8` (a matrix over sweep.sae.ks; they ask for a GPU) -> `c`;
`d` (params extract) alone. params.yaml is the tiny preset (`cedar flow` validates it) with sweep.sae.ks [4, 8].
Every command is `python step.py NAME OUT [--in IN]...`, which writes a JSON of its inputs and one param (a changed
report title reruns `a` with the same output) and appends its start and end times to runs.log (outside DVC; so is
`sleep`, seconds every step waits), so a test can see what ran, when and where.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from cli.main import main
from flow.graph import Project, StageError, set_params
from pipeline.presets import preset_text
from tests.scratch import env, git

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

STEP = '''"""step.py NAME OUT [--in PATH]... [--key DOTTED.KEY] [--no-output] [--fail-once]"""
import argparse, json, os, time, yaml
p = argparse.ArgumentParser()
p.add_argument("name"); p.add_argument("out"); p.add_argument("--in", dest="inputs", action="append", default=[])
p.add_argument("--key", default="seed")
p.add_argument("--no-output", action="store_true"); p.add_argument("--fail-once", action="store_true")
a = p.parse_args()
start = time.time()
if a.fail_once and not os.path.exists(a.name + ".failed"):
    open(a.name + ".failed", "w").close()
    raise SystemExit(3)
time.sleep(float(open("sleep").read()) if os.path.exists("sleep") else 0.0)
value = yaml.safe_load(open("params.yaml"))
for part in a.key.split("."):
    value = value[part]
record = {"name": a.name, "inputs": [open(i).read() for i in a.inputs], "value": value, "mark": os.environ.get("MARK")}
if not a.no_output:
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    json.dump(record, open(a.out, "w"), sort_keys=True)
with open("runs.log", "a") as log:
    log.write(json.dumps({"name": a.name, "start": start, "end": time.time(), "threads": os.environ.get("OMP_NUM_THREADS"),
                          "stage": os.environ.get("DVC_STAGE"), "mark": os.environ.get("MARK")}) + "\\n")
'''

DVC_YAML = {"stages": {
    "a": {"cmd": "python step.py a out/a.json --key seed", "deps": ["step.py"], "params": ["seed", "report"], "outs": ["out/a.json"]},
    "b": {"matrix": {"n": "${sweep.sae.ks}"}, "cmd": "python step.py b@${item.n} out/b-${item.n}.json --in out/a.json",
          "deps": ["out/a.json", "step.py"], "outs": ["out/b-${item.n}.json"], "meta": {"resources": {"GPU": 1}}},
    "c": {"cmd": "python step.py c out/c.json --in out/b-4.json --in out/b-8.json", "deps": ["out/b-4.json", "out/b-8.json"],
          "outs": ["out/c.json"]},
    "d": {"cmd": "python step.py d out/d.json --key extract", "deps": ["step.py"], "params": ["extract"], "outs": ["out/d.json"]},
}}


def tiny(**changes: object) -> dict:
    """The tiny preset with sweep.sae.ks [4, 8] and `changes` ({"extract.batch_size": 64, ...})."""
    params = yaml.safe_load(preset_text("tiny"))
    params["sweep"]["sae"]["ks"] = [4, 8]
    for key, value in changes.items():
        *path, last = key.split(".")
        node = params
        for part in path:
            node = node[part]
        node[last] = value
    return params


CLUSTERS = {"local": {"kind": "local", "workers": 2, "dashboard": None},
            "batch": {"kind": "slurm", "cores": 1, "memory": "1GB", "queue": "gone", "max_jobs": 2}}


def toy(tmp: Path, dvc_yaml: dict | None = None, params: dict | None = None, sleep: float = 0.0) -> Path:
    """A git + DVC project with the toy graph."""
    repo = tmp / "toy"
    repo.mkdir(parents=True)
    (repo / "step.py").write_text(STEP)
    (repo / "dvc.yaml").write_text(yaml.safe_dump(dvc_yaml or DVC_YAML, sort_keys=False))
    (repo / "params.yaml").write_text(yaml.safe_dump(params or tiny(), sort_keys=False))
    (repo / "sleep").write_text(str(sleep))
    (repo / "cluster.yaml").write_text(yaml.safe_dump(CLUSTERS))
    (repo / ".gitignore").write_text("/out/\nruns.log\nsleep\n*.failed\n.prefect/\n")
    git(repo, "init", "-q")
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=repo, env=env(), check=True)
    git(repo, "add", "-A")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "toy")
    return repo


@pytest.fixture(autouse=True)
def python_on_path(monkeypatch, tmp_path):
    """The stages' `python` is this interpreter (as in tests.test_e2e.env); the working directory the flow changes
    (to the project's root) comes back after the test."""
    for key, value in env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)


def flow(repo: Path, *args: str, capsys=None) -> tuple[int, str, str]:
    """`cedar flow ARGS` in this process; (exit status, stdout, stderr) when capsys is given."""
    code = main(["flow", "--root", str(repo), *args])
    if capsys is None:
        return code, "", ""
    out, err = capsys.readouterr()
    return code, out, err


def dry(repo: Path, capsys, *args: str) -> list[str]:
    code, out, err = flow(repo, "--dry", *args, capsys=capsys)
    assert code == 0, err
    return out.split()


def dvc(repo: Path, *args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, env=env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def runs(repo: Path) -> list[dict]:
    path = repo / "runs.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def lock(repo: Path) -> dict:
    return yaml.safe_load((repo / "dvc.lock").read_text())["stages"]


def test_plan_is_dvc_repros_in_order_with_targets_like_dvc_repro(tmp_path, capsys):
    repo = toy(tmp_path)
    assert dry(repo, capsys) == ["a", "b@4", "b@8", "c", "d"]
    assert dry(repo, capsys, "c") == ["a", "b@4", "b@8", "c"]
    assert dry(repo, capsys, "b@8") == ["a", "b@8"]
    assert dry(repo, capsys, "b") == ["a", "b@4", "b@8"], "a matrix group selects its cells"
    assert dry(repo, capsys, "b@*", "d") == ["a", "b@4", "b@8", "d"], "globs as dvc repro --glob"
    code, _, err = flow(repo, "--dry", "nope", capsys=capsys)
    assert code == 1 and "nope" in err and len(err.strip().splitlines()) == 1
    dvc(repo, "repro")
    assert dry(repo, capsys) == [], "after dvc repro nothing is stale"
    (repo / "params.yaml").write_text(yaml.safe_dump(tiny(**{"extract.batch_size": 64})))
    assert sorted(json.loads(dvc(repo, "status", "--json"))) == ["d"]
    assert dry(repo, capsys) == ["d"]
    (repo / "params.yaml").write_text(yaml.safe_dump(tiny(seed=2)))
    assert dry(repo, capsys) == ["a", "b@4", "b@8", "c"], "downstream of a stale stage is planned"


def test_flow_records_what_dvc_repro_records_and_each_sees_the_other_up_to_date(tmp_path, capsys):
    flowed, repro = toy(tmp_path / "f"), toy(tmp_path / "r")
    code, out, err = flow(flowed, "--cluster", "local", capsys=capsys)
    assert code == 0, err
    assert sorted(line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage")) == ["a", "b@4", "b@8", "c", "d"]
    assert dvc(flowed, "status").strip() == "Data and pipelines are up to date."
    assert "Running stage" not in dvc(flowed, "repro")
    dvc(repro, "repro")
    assert lock(flowed) == lock(repro), "the same hashes of deps, params and outputs in dvc.lock"
    for name in ["a.json", "b-4.json", "b-8.json", "c.json", "d.json"]:
        assert (flowed / "out" / name).read_text() == (repro / "out" / name).read_text()
    code, out, _ = flow(repro, "--cluster", "local", capsys=capsys)
    assert code == 0 and out.strip() == "Data and pipelines are up to date."
    assert {r["stage"] for r in runs(flowed)} == {"a", "b@4", "b@8", "c", "d"}, "DVC_STAGE is set as dvc repro sets it"


def test_independent_stages_overlap_and_an_unchanged_output_stops_the_rerun(tmp_path, capsys):
    repo = toy(tmp_path, sleep=2)
    # d first, alone: run beside a, it could end just as b@4 and b@8 are submitted, and Dask then may queue both on
    # the worker that ran a while d's worker is still counted busy (seen in 2 of 6 runs: b@4 started when b@8 ended)
    code, _, err = flow(repo, "--cluster", "local", "d", capsys=capsys)
    assert code == 0, err
    code, _, err = flow(repo, "--cluster", "local", capsys=capsys)
    assert code == 0, err
    spans = {r["name"]: (r["start"], r["end"]) for r in runs(repo)}
    assert spans["b@4"][0] < spans["b@8"][1] and spans["b@8"][0] < spans["b@4"][1], f"b@4 and b@8 ran one after the other: {spans}"
    assert spans["c"][0] >= max(spans["b@4"][1], spans["b@8"][1]), "c waits for both"
    (repo / "params.yaml").write_text(yaml.safe_dump(tiny(**{"report.title": "new"})))  # a reruns, its output is the same
    assert dry(repo, capsys) == ["a", "b@4", "b@8", "c"]
    code, out, err = flow(repo, "--cluster", "local", capsys=capsys)
    assert code == 0, err
    assert [line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage")] == ["a"]
    assert "Stage 'b@4' did not change, skipping" in out
    assert dvc(repo, "status").strip() == "Data and pipelines are up to date."


def test_a_batch_job_that_cannot_be_submitted_stops_the_flow_within_seconds_with_the_batch_systems_message(tmp_path, capsys, monkeypatch):
    """An `sbatch` that passes the check before the flow (`--test-only`) but refuses the submission (the partition
    went away meanwhile): the real dask-jobqueue cluster submits, the flow stops a few seconds later, without
    retries, in one line with sbatch's message and the entry's name; nothing is recorded, and the jobs' logs would
    go to the project's logs/jobs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text('#!/bin/sh\nif [ "$1" = "--test-only" ]; then echo "sbatch: Job 1 to start now" >&2; exit 0; fi\n'
                                    f'date +%s.%N >> {tmp_path}/submitted\n'
                                    'echo "sbatch: error: invalid partition specified: gone" >&2\n'
                                    'echo "sbatch: error: Batch job submission failed: Invalid partition name specified" >&2\nexit 1\n')
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    repo = toy(tmp_path)
    code, out, err = flow(repo, "--cluster", "batch", capsys=capsys)
    stopped = time.time()
    assert code == 1
    assert err.strip().splitlines()[-1] == ("error: cluster.yaml: batch: the batch system refused a job: sbatch: error: invalid partition specified: gone; "
                                            "sbatch: error: Batch job submission failed: Invalid partition name specified; 0 of 5 stages finished and "
                                            "are recorded in dvc.lock")
    first_refusal = float((tmp_path / "submitted").read_text().split()[0])
    assert stopped - first_refusal < 30, f"the flow took {stopped - first_refusal:.0f} s to stop after the refusal"
    assert "Running stage" in out and not (repo / "dvc.lock").exists() and (repo / "logs" / "jobs").is_dir()


def test_failed_and_incomplete_stages_are_not_recorded_and_finished_ones_are(tmp_path, capsys):
    stages = json.loads(json.dumps(DVC_YAML))
    stages["stages"]["b"]["cmd"] += " --fail-once"
    stages["stages"]["d"]["cmd"] += " --no-output"
    repo = toy(tmp_path, dvc_yaml=stages)
    code, out, err = flow(repo, "--cluster", "local", "--retries", "0", capsys=capsys)
    assert code == 1
    message = err.strip().splitlines()[-1]
    assert message.startswith("error: failed stages: ") and all(name in message for name in ("b@4", "b@8", "d", "not run: c"))
    assert set(lock(repo)) == {"a"}, "only the stage that finished with all its outputs is recorded"
    assert dry(repo, capsys) == ["b@4", "b@8", "c", "d"]
    stages["stages"]["d"]["cmd"] = DVC_YAML["stages"]["d"]["cmd"]
    (repo / "dvc.yaml").write_text(yaml.safe_dump(stages, sort_keys=False))
    code, out, err = flow(repo, "--cluster", "local", capsys=capsys)  # b's commands now succeed (they failed once)
    assert code == 0, err
    assert sorted(line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage")) == ["b@4", "b@8", "c", "d"]
    assert dvc(repo, "status").strip() == "Data and pipelines are up to date."


def test_a_failing_command_is_retried(tmp_path, capsys):
    stages = json.loads(json.dumps(DVC_YAML))
    stages["stages"]["d"]["cmd"] += " --fail-once"
    repo = toy(tmp_path, dvc_yaml=stages)
    code, out, err = flow(repo, "--cluster", "local", "d", capsys=capsys)
    assert code == 0, err
    assert out.count("Running stage 'd'") == 2 and set(lock(repo)) == {"d"}


def test_a_task_whose_wait_fails_while_its_command_runs_takes_that_commands_result_on_retry(tmp_path, capsys, monkeypatch):
    """The task's attempt fails while its command runs on (seen: distributed's timed wait raising, the Prefect API
    gone): the retry waits for that command instead of removing its outputs and starting it again beside it."""
    import flow.prefect_flow as prefect_flow

    repo = toy(tmp_path, sleep=1.0)
    wait_for = prefect_flow.result
    failed = []

    def fails_once(future, submissions):
        if not failed:
            failed.append(future.key)
            raise RuntimeError("the wait broke, not the command")
        return wait_for(future, submissions)

    monkeypatch.setattr(prefect_flow, "result", fails_once)
    code, out, err = flow(repo, "--cluster", "local", "d", capsys=capsys)
    assert code == 0, err
    assert out.count("Running stage 'd'") == 1 and "Stage 'd': waiting for the command an earlier attempt started" in out
    assert [r["name"] for r in runs(repo)] == ["d"] and set(lock(repo)) == {"d"}
    assert dvc(repo, "status", "d").strip() == "Data and pipelines are up to date."


def test_a_retried_start_runs_the_stage_again_and_never_checks_out_the_last_runs_outputs(tmp_path):
    """After `start` saved a stage's new deps, its outputs' hashes still describe the last run: a second `start`
    (a retried attempt) must not take them for this run's and restore the old outputs under the new params."""
    repo = toy(tmp_path)
    project = Project(repo)
    try:
        project.plan(["d"])
        assert project.start("d") == "run"
        subprocess.run([sys.executable, "step.py", "d", "out/d.json", "--key", "extract"], cwd=repo, check=True)
        project.record("d")
    finally:
        project.close()
    old = (repo / "out" / "d.json").read_text()
    set_params(repo / "params.yaml", ["extract.batch_size=3"])
    project = Project(repo)
    try:
        assert [s.name for s in project.plan(["d"])] == ["d"]
        assert project.start("d") == "run"
        assert project.start("d") == "run" and not (repo / "out" / "d.json").exists()
        subprocess.run([sys.executable, "step.py", "d", "out/d.json", "--key", "extract"], cwd=repo, check=True)
        project.record("d")
    finally:
        project.close()
    new = json.loads((repo / "out" / "d.json").read_text())
    assert new["value"]["batch_size"] == 3 and json.loads(old)["value"]["batch_size"] != 3
    assert dvc(repo, "status", "d").strip() == "Data and pipelines are up to date."


def test_gpu_stages_go_only_to_workers_that_offer_a_gpu(tmp_path, capsys):
    """A real scheduler with one GPU worker and one CPU worker (`dask worker --resources GPU=1`); the stages that
    ask for a GPU in dvc.yaml run on the GPU worker, the others anywhere. A cluster without GPUs runs them all."""
    repo = toy(tmp_path)
    scheduler_file = tmp_path / "scheduler.json"
    e = {**env(), "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", "0", "--no-dashboard", "--scheduler-file",
                               str(scheduler_file)], env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        for mark, extra in (("gpu", ["--resources", "GPU=1"]), ("cpu", [])):
            procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(scheduler_file), "--nthreads",
                                           "1", "--no-dashboard", *extra], env={**e, "MARK": mark}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from distributed import Client

        deadline = time.time() + 120
        while not scheduler_file.exists() and time.time() < deadline:
            time.sleep(0.2)
        with Client(scheduler_file=str(scheduler_file), timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
            address = client.scheduler.address
        clusters = {"lab": {"kind": "address", "address": address, "resources": {"GPU": 1}}}
        (repo / "cluster.yaml").write_text(yaml.safe_dump(clusters))
        code, _, err = flow(repo, "--cluster", "lab", capsys=capsys)
        assert code == 0, err
        marks = {r["name"]: r["mark"] for r in runs(repo)}
        assert marks["b@4"] == marks["b@8"] == "gpu" and set(marks) == {"a", "b@4", "b@8", "c", "d"}
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=60)


def test_set_params_checks_the_result_first(tmp_path):
    repo = toy(tmp_path)
    (repo / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    set_params(repo / "params.yaml", ["train.epochs=3", "sweep.sae.ks=[8,16]"])
    params = yaml.safe_load((repo / "params.yaml").read_text())
    assert params["train"]["epochs"] == 3 and params["sweep"]["sae"]["ks"] == [8, 16]
    before = (repo / "params.yaml").read_text()
    with pytest.raises(ValueError, match=r"train\.epochs"):
        set_params(repo / "params.yaml", ["train.epochs=-1"])
    with pytest.raises(StageError, match="-S"):
        set_params(repo / "params.yaml", ["train.epochs"])
    assert (repo / "params.yaml").read_text() == before
    assert not [p for p in repo.iterdir() if p.name.startswith(".params-")]


def test_record_refuses_a_stage_whose_output_is_missing(tmp_path):
    repo = toy(tmp_path)
    project = Project(repo)
    try:
        assert [s.name for s in project.plan(["d"])] == ["d"]
        assert project.start("d") == "run"
        with pytest.raises(StageError, match="out/d.json"):
            project.record("d")
        assert not (repo / "dvc.lock").exists()
        subprocess.run([sys.executable, "step.py", "d", "out/d.json", "--key", "extract"], cwd=repo, check=True)
        project.record("d")
    finally:
        project.close()
    assert set(lock(repo)) == {"d"} and os.path.exists(repo / ".dvc" / "cache")


def test_cedar_serve_runs_the_flow_as_a_deployment_with_param_overrides(tmp_path):
    """`cedar serve` offline (it starts Prefect's temporary server and prints its address); `prefect deployment run`
    with `-p overrides=[...]` sets the params as `dvc exp run -S` would and runs the stale stage of the target."""
    repo = toy(tmp_path)
    e = {**env(), "PYTHONPATH": str(ROOT)}
    e.pop("PREFECT_API_URL", None)
    serve = subprocess.Popen([sys.executable, "-m", "cli", "serve", "d", "--root", str(repo)], env=e, cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        while url is None:
            line = serve.stdout.readline()
            assert line, "cedar serve exited before printing the Prefect API address"
            if line.startswith("Prefect API: "):
                url = line.split()[2]
        run = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run", "cedar-pipeline/cedar", "-p", 'overrides=["extract.batch_size=64"]',
                              "--watch", "--watch-timeout", "600"], env={**e, "PREFECT_API_URL": url}, cwd=tmp_path, capture_output=True, text=True,
                             timeout=700)
        assert run.returncode == 0 and "Completed" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
    finally:
        serve.send_signal(signal.SIGINT)  # Ctrl-C
        serve.wait(timeout=120)
    assert not [p for p in psutil.process_iter(["cmdline"]) if url.split("/api")[0].rsplit(":", 1)[1] in " ".join(p.info["cmdline"] or [])
                and "uvicorn" in " ".join(p.info["cmdline"] or [])], "the temporary server stopped with cedar serve"
    assert yaml.safe_load((repo / "params.yaml").read_text())["extract"]["batch_size"] == 64
    assert lock(repo)["d"]["params"]["params.yaml"]["extract"]["batch_size"] == 64 and set(lock(repo)) == {"d"}
