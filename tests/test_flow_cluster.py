"""The cluster file: the shipped example, its validation (one line per problem naming the key, before anything
starts, also under `cedar flow --dry`), the batch job script, and the Dask cluster settings each kind makes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cli.main import main
from flow.cluster import (
    AddressSettings,
    ClusterError,
    JobqueueSettings,
    LocalSettings,
    choose_cluster,
    jobqueue_options,
    load_clusters,
    task_runner,
)
from flow.command import thread_environment

ROOT = Path(__file__).resolve().parents[1]


def test_the_shipped_cluster_file_is_valid_and_local_is_its_default():
    clusters = load_clusters(ROOT / "cluster.yaml")
    assert clusters["local"] == LocalSettings(workers=2)
    gpu = clusters["slurm-gpu"]
    assert isinstance(gpu, JobqueueSettings) and gpu.resources == {"GPU": 1} and (gpu.min_jobs, gpu.max_jobs) == (0, 8)


def test_the_slurm_job_script_of_the_shipped_example_asks_for_a_gpu_memory_and_time(capsys):
    assert main(["cluster", "script", "slurm-gpu", "--root", str(ROOT)]) == 0
    script = capsys.readouterr().out
    for line in ("#SBATCH -p gpu", "#SBATCH --gres=gpu:1", "#SBATCH --mem=30G", "#SBATCH -t 04:00:00", "#SBATCH --cpus-per-task=8"):
        assert line in script.splitlines(), line
    assert "--resources GPU=1" in script and "--nthreads 1" in script, "one stage at a time, on a worker that offers the GPU"


def test_a_local_cluster_is_not_a_batch_system(capsys):
    assert main(["cluster", "script", "local", "--root", str(ROOT)]) == 2
    assert "only batch-system clusters" in capsys.readouterr().err


@pytest.mark.parametrize("text, name, message", [
    ("local: {kind: local, workers: -2}", "local", "cluster.yaml: local.workers: Input should be greater than or equal to 1 (got -2)"),
    ("local: {kind: local, workerz: 2}", "local", "cluster.yaml: local.workerz: unknown key"),
    ("local: {kind: lokal}", "local", "cluster.yaml: local.kind: unknown kind 'lokal'; expected one of local, address, slurm, pbs, lsf, sge, htcondor"),
    ("gpu: {kind: slurm, cores: 1, memory: 1GB, partition: gpu}", "gpu", "cluster.yaml: gpu.partition: unknown key (neither a flow setting nor a SLURMCluster argument)"),
    ("gpu: {kind: slurm, cores: 1, memory: 1GB, min_jobs: 3, max_jobs: 2}", "gpu", "cluster.yaml: gpu: min_jobs: 3 > max_jobs 2"),
    ("gpu: {kind: pbs, queue: q}", "gpu", "cluster.yaml: gpu: PBSCluster: You must specify how much cores and memory per job"),  # its own check
    ("lab: {kind: address, address: scheduler:8786}", "lab", "cluster.yaml: lab.address: expected a scheduler address such as tcp://host:8786, got 'scheduler:8786'"),
    ("lab: {kind: address, address: tcp://h:1, resources: {GPU: 0}}", "lab", "cluster.yaml: lab.resources.GPU: Input should be greater than 0 (got 0)"),
    ("local: {kind: local\n  workers: 2", "local", "cluster.yaml: not valid YAML at line 2, column 10: expected ',' or '}', but got ':'"),
    ("local: {kind: local}", "gpu", "cluster.yaml: no cluster 'gpu'; it has local"),
])
def test_a_bad_cluster_file_fails_in_one_line_naming_the_key_also_under_dry(tmp_path, capsys, monkeypatch, text, name, message):
    (tmp_path / "cluster.yaml").write_text(text)
    with pytest.raises(ClusterError) as error:
        choose_cluster(tmp_path / "cluster.yaml", name)
    assert str(error.value).replace(str(tmp_path) + "/", "").startswith(message) and "\n" not in str(error.value)
    monkeypatch.chdir(tmp_path)
    assert main(["flow", "--dry", "--cluster", name, "--cluster-file", str(tmp_path / "cluster.yaml"), "--root", str(ROOT)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.replace(str(tmp_path) + "/", "").startswith(f"error: {message}")


def test_every_problem_of_the_file_is_reported_one_per_line(tmp_path):
    (tmp_path / "c.yaml").write_text("a: {kind: local, workers: 0}\nb: {kind: local, processes: 3}\nc: {kind: nope}\n")
    with pytest.raises(ClusterError) as error:
        load_clusters(tmp_path / "c.yaml")
    lines = str(error.value).replace(str(tmp_path) + "/", "").splitlines()
    assert [line.split(":")[1].strip() for line in lines] == ["a.workers", "b.processes", "c.kind"]


def test_without_a_cluster_file_local_is_one_worker_and_dask_names_a_scheduler(tmp_path):
    assert choose_cluster(tmp_path / "missing.yaml") == LocalSettings()
    with pytest.raises(ClusterError, match="no such file"):
        choose_cluster(tmp_path / "missing.yaml", "gpu")
    assert choose_cluster(tmp_path / "missing.yaml", "anything", "tcp://host:8786") == AddressSettings(address="tcp://host:8786")
    with pytest.raises(ClusterError, match="--dask.address"):
        choose_cluster(tmp_path / "missing.yaml", address="host")


def test_each_kind_becomes_a_dask_task_runner():
    local = task_runner(LocalSettings(workers=3, processes=True, resources={"GPU": 1}, memory_limit="2GB"))
    assert local.cluster_kwargs == {"n_workers": 3, "threads_per_worker": 1, "processes": True, "dashboard_address": ":8787",
                                    "resources": {"GPU": 1}, "memory_limit": "2GB"}
    assert task_runner(AddressSettings(address="tcp://h:8786")).address == "tcp://h:8786"
    slurm = JobqueueSettings(kind="slurm", min_jobs=1, max_jobs=4, options={"cores": 1, "memory": "4GB", "worker_extra_args": ["--lifetime", "1h"]},
                             resources={"GPU": 1})
    runner = task_runner(slurm)
    assert runner.cluster_class.__name__ == "SLURMCluster" and runner.adapt_kwargs == {"minimum_jobs": 1, "maximum_jobs": 4}
    assert runner.cluster_kwargs["worker_extra_args"] == ["--lifetime", "1h", "--resources", "GPU=1"]


def test_every_jobqueue_kind_knows_its_own_arguments():
    assert {"queue", "cores", "memory", "walltime", "job_extra_directives", "account", "job_cpu"} <= jobqueue_options("slurm")
    assert "resource_spec" in jobqueue_options("pbs") and "ncpus" in jobqueue_options("lsf") and "disk" in jobqueue_options("htcondor")
    assert "job_cpu" not in jobqueue_options("pbs") and "scheduler" not in jobqueue_options("sge")


def test_stage_threads_are_the_shells_or_the_clusters(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert thread_environment(None) == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": None, "OPENBLAS_NUM_THREADS": None}
    assert thread_environment(4) == dict.fromkeys(["OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"], "4")
    assert yaml.safe_load((ROOT / "cluster.yaml").read_text())["slurm-gpu"]["threads"] == 8
