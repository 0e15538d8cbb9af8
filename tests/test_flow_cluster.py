"""The cluster file: the shipped example, its validation (every problem at once, one line each naming the key,
before anything starts, also under `cedar flow --dry`), the batch job script, the check of a SLURM entry against
sbatch without submitting, a refused submission's message, and the Dask cluster settings each kind makes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cli.main import main
from flow.cluster import (
    DEPRECATED,
    JOBQUEUE,
    KIND_OPTION_TYPES,
    OPTION_TYPES,
    UNSUPPORTED,
    AddressSettings,
    ClusterError,
    JobqueueSettings,
    LocalSettings,
    SubmissionError,
    Submissions,
    check_submission,
    choose_cluster,
    jobqueue_options,
    load_clusters,
    task_runner,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_shipped_cluster_file_is_valid_and_local_is_its_default():
    clusters = load_clusters(ROOT / "cluster.yaml")
    assert clusters["local"] == LocalSettings(workers=2)
    gpu = clusters["slurm-gpu"]
    assert isinstance(gpu, JobqueueSettings) and gpu.resources == {"GPU": 1} and (gpu.min_jobs, gpu.max_jobs) == (0, 8)


def test_the_slurm_job_script_of_the_shipped_example_is_what_its_comments_say(tmp_path, capsys):
    """The comments of cluster.yaml name the #SBATCH lines; `cedar cluster script` without a name shows the file's
    first batch entry; job logs go to the project's logs/jobs (git-ignored), whatever the working directory."""
    shutil.copy(ROOT / "cluster.yaml", tmp_path / "cluster.yaml")
    assert main(["cluster", "script", "slurm-gpu", "--root", str(tmp_path)]) == 0
    script = capsys.readouterr().out
    assert main(["cluster", "script", "--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out == script, "without a name: the first batch-system entry"
    lines = script.splitlines()
    for line in ("#SBATCH -p gpu", "#SBATCH -A my-lab", "#SBATCH --gres=gpu:1", "#SBATCH --mem=32G", "#SBATCH -t 04:00:00", "#SBATCH --cpus-per-task=8",
                 f"#SBATCH -o {tmp_path}/logs/jobs/dask-worker-%J.out", f"#SBATCH -e {tmp_path}/logs/jobs/dask-worker-%J.err"):
        assert line in lines, line
        assert line.split()[-1].replace(f"{tmp_path}/", "").replace("%J", "<job id>").split(".")[0] in (ROOT / "cluster.yaml").read_text()
    assert "--resources GPU=1" in script and "--nthreads 1" in script and "--memory-limit 32.00GiB" in script
    worker = next(i for i, line in enumerate(lines) if "distributed.cli.dask_worker" in line)
    assert lines[worker - 1] == "export DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False", "the workers' profiler off (dask/distributed#8616)"
    assert lines[worker - 2] == "source .venv/bin/activate", "after the entry's own prologue"
    assert "/logs/" in (ROOT / ".gitignore").read_text().splitlines()


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
    ("lab: {kind: address}", "lab", "cluster.yaml: lab.address: missing: a cluster of kind address needs it"),
    ("gpu: {kind: slurm, cores: one, memory: 1GB}", "gpu", "cluster.yaml: gpu.cores: Input should be a valid integer (got 'one')"),
    ("gpu: {kind: slurm, cores: 1, memory: 1GB, job_extra_directives: --gres=gpu:1}", "gpu",
     "cluster.yaml: gpu.job_extra_directives: expected a list of strings, got the string '--gres=gpu:1' (write [\"--gres=gpu:1\"])"),
    ("gpu: {kind: slurm, cores: 1, memory: 1GB, walltime: 12:00:00}", "gpu",
     'cluster.yaml: gpu.walltime: YAML read it as the number 43200 (an unquoted 12:00:00 is a base-60 number in YAML); quote it, e.g. walltime: "12:00:00"'),
    ("gpu: {kind: slurm, cores: 1, memory: 32}", "gpu", "cluster.yaml: gpu.memory: Input should be a valid string (got 32)"),
    ("gpu: {kind: slurm, cores: 1, memory: 1GB, job_script_prologue: [1]}", "gpu", "cluster.yaml: gpu.job_script_prologue.0: Input should be a valid string (got 1)"),
    ("gpu: {kind: slurm, cores: 1, memory: 1GB, nanny: 'yes'}", "gpu", "cluster.yaml: gpu.nanny: Input should be a valid boolean (got 'yes')"),
    ("gpu: {kind: slurm, cores: 1, memory: 1GB, job_extra: [-x]}", "gpu", "cluster.yaml: gpu.job_extra: deprecated by dask-jobqueue; write `job_extra_directives` instead"),
    ("gpu: {kind: slurm, cores: 1, memory: lots}", "gpu", "cluster.yaml: gpu: SLURMCluster:"),  # its own check of the memory
    ("condor: {kind: htcondor, cores: 1, memory: 1GB, disk: 1GB, job_extra_directives: [+A]}", "condor",
     "cluster.yaml: condor.job_extra_directives: Input should be a valid dictionary (got ['+A'])"),
    ("local: {kind: local, workers: 2, threads: 1}", "local", "cluster.yaml: local.threads: CPU threads are params.yaml's `threads` now"),
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


def test_every_problem_of_the_file_is_reported_one_per_line(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("a: {kind: local, workers: 0}\nb: {kind: local, processes: 3}\nc: {kind: nope}\n"
                                     "d: {kind: slurm, cores: one, memory: 1GB, walltime: 1:00:00, job_extra_directives: -x, partition: p, min_jobs: -1}\n"
                                     "e: {kind: address}\nok: {kind: local}\n")
    with pytest.raises(ClusterError) as error:
        load_clusters(tmp_path / "c.yaml")
    lines = str(error.value).replace(str(tmp_path) + "/", "").splitlines()
    assert [line.split(":")[1].strip() for line in lines] == ["a.workers", "b.processes", "c.kind", "d.partition", "d.cores", "d.job_extra_directives",
                                                              "d.walltime", "d.min_jobs", "e.address"]
    assert main(["flow", "--dry", "--cluster", "ok", "--cluster-file", str(tmp_path / "c.yaml"), "--root", str(ROOT)]) == 2
    assert capsys.readouterr().err.replace(str(tmp_path) + "/", "") == f"error: {chr(10).join(lines)}\n", "the entry chosen is fine, the file is not"


def test_every_argument_of_every_jobqueue_class_has_a_type():
    for kind in JOBQUEUE:
        untyped = jobqueue_options(kind) - set(OPTION_TYPES) - set(KIND_OPTION_TYPES.get(kind, {})) - set(DEPRECATED) - set(UNSUPPORTED)
        assert not untyped, f"{kind}: add {sorted(untyped)} to flow.cluster.OPTION_TYPES"


def test_without_a_cluster_file_local_is_one_worker_and_dask_names_a_scheduler(tmp_path):
    assert choose_cluster(tmp_path / "missing.yaml") == LocalSettings()
    with pytest.raises(ClusterError, match="no such file"):
        choose_cluster(tmp_path / "missing.yaml", "gpu")
    assert choose_cluster(tmp_path / "missing.yaml", "anything", "tcp://host:8786") == AddressSettings(address="tcp://host:8786")
    with pytest.raises(ClusterError, match="--dask.address"):
        choose_cluster(tmp_path / "missing.yaml", address="host")


def test_each_kind_becomes_a_dask_task_runner(tmp_path):
    local = task_runner(LocalSettings(workers=3, processes=True, resources={"GPU": 1}, memory_limit="2GB"), tmp_path)
    assert local.cluster_kwargs == {"n_workers": 3, "threads_per_worker": 1, "processes": True, "dashboard_address": ":8787",
                                    "resources": {"GPU": 1}, "memory_limit": "2GB"}
    assert task_runner(AddressSettings(address="tcp://h:8786"), tmp_path).address == "tcp://h:8786"
    slurm = JobqueueSettings(kind="slurm", min_jobs=1, max_jobs=4, options={"cores": 1, "memory": "4GB", "worker_extra_args": ["--lifetime", "1h"]},
                             resources={"GPU": 1})
    submissions = Submissions("cluster.yaml: gpu")
    runner = task_runner(slurm, tmp_path, submissions)
    assert runner.cluster_class.__name__ == "SLURMCluster" and runner.adapt_kwargs == {"minimum_jobs": 1, "maximum_jobs": 4}
    assert runner.cluster_kwargs["worker_extra_args"] == ["--lifetime", "1h", "--resources", "GPU=1"]
    assert runner.cluster_kwargs["log_directory"] == str(tmp_path / "logs" / "jobs")
    assert issubclass(runner.cluster_kwargs["job_cls"], runner.cluster_class.job_cls), "the class's own job, reporting refusals"


def test_every_jobqueue_kind_knows_its_own_arguments():
    assert {"queue", "cores", "memory", "walltime", "job_extra_directives", "account", "job_cpu"} <= jobqueue_options("slurm")
    assert "resource_spec" in jobqueue_options("pbs") and "ncpus" in jobqueue_options("lsf") and "disk" in jobqueue_options("htcondor")
    assert "job_cpu" not in jobqueue_options("pbs") and "scheduler" not in jobqueue_options("sge")


def fake_sbatch(tmp_path: Path, monkeypatch, test_only: str, submit: str) -> None:
    """An `sbatch` first on PATH that answers --test-only with `test_only` and a submission with `submit` (a line
    starting with "error" makes it fail, as sbatch does)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "sbatch"
    lines = ["#!/bin/sh"]
    for flag, answer in (("--test-only", test_only), ("", submit)):
        fail = answer.startswith("error")
        guard = f'if [ "$1" = "{flag}" ]; then' if flag else "if true; then"
        lines += [guard, f"  echo 'sbatch: {answer}' >&2", f"  exit {1 if fail else 0}", "fi"]
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


SLURM = JobqueueSettings(kind="slurm", options={"cores": 1, "memory": "1GB", "queue": "nosuch"})


def test_a_slurm_entry_is_checked_with_sbatch_test_only_and_its_message_kept(tmp_path, monkeypatch):
    fake_sbatch(tmp_path, monkeypatch, "error: invalid partition specified: nosuch", "Submitted batch job 1")
    with pytest.raises(ClusterError) as error:
        check_submission(SLURM, "cluster.yaml: bad")
    assert str(error.value) == "cluster.yaml: bad: `sbatch --test-only` refuses its job: sbatch: error: invalid partition specified: nosuch"
    fake_sbatch(tmp_path, monkeypatch, "Job 3 to start at 2026-01-01T00:00:00 using 1 processors on nodes n in partition p", "Submitted batch job 1")
    assert check_submission(SLURM, "cluster.yaml: ok") is None


def test_without_sbatch_a_dry_run_notes_it_and_a_run_refuses(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "sbatch is not on PATH" in check_submission(SLURM, "cluster.yaml: gpu")
    with pytest.raises(ClusterError, match="sbatch is not on PATH: run the flow where SLURM's commands are"):
        check_submission(SLURM, "cluster.yaml: gpu", required=True)
    assert check_submission(LocalSettings(), "cluster.yaml: local") is None
    pbs = JobqueueSettings(kind="pbs", options={"cores": 1, "memory": "1GB"})
    assert "cannot be checked before it is submitted" in check_submission(pbs, "cluster.yaml: pbs", required=True)


def test_a_refused_submission_keeps_sbatchs_message_in_one_line():
    submissions = Submissions("cluster.yaml: gpu")
    submissions.check()
    submissions.refuse(RuntimeError("Command exited with non-zero exit code.\nExit code: 1\nCommand:\nsbatch /tmp/x.sh\nstdout:\n\nstderr:\n"
                                    "sbatch: error: invalid partition specified: nosuch\nsbatch: error: Batch job submission failed: Invalid partition\n\n"))
    submissions.refuse(RuntimeError("a later one is not kept"))
    with pytest.raises(SubmissionError) as error:
        submissions.check()
    assert str(error.value) == ("cluster.yaml: gpu: the batch system refused a job: sbatch: error: invalid partition specified: nosuch; "
                                "sbatch: error: Batch job submission failed: Invalid partition")
