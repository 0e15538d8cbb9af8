"""Where the flow runs stages: the cluster file (cluster.yaml), its validation, and the Dask cluster it describes.

The cluster file maps names to clusters (`cedar flow --cluster NAME`, default `local`); each has a `kind`:

- `local`: a `distributed.LocalCluster` on this machine, `workers` stages at once, as threads (default: the work
  is in each stage's own process anyway) or `processes: true`;
- `address`: an existing Dask scheduler (`cedar flow --dask ADDRESS` is the shortcut);
- `slurm`, `pbs`, `lsf`, `sge`, `htcondor`: the dask-jobqueue class of that name, with its own keyword arguments
  written flat in the entry (`queue`, `cores`, `memory`, `walltime`, `job_extra_directives`, ...), scaled
  adaptively between `min_jobs` and `max_jobs` batch jobs. Their logs go to `log_directory` (default `logs/jobs`
  of the project, which git ignores), relative paths taken from the project's root.

Every kind also takes `resources` (the Dask resources each worker offers, e.g. `{GPU: 1}`: given to the workers
it starts, declared for an `address` scheduler's). A stage that asks for a resource in dvc.yaml
(`meta: {resources: {GPU: 1}}`) gets it only on a cluster that offers it, so on a GPU cluster training and
extraction go only to GPU workers, one per GPU, and elsewhere every stage runs anywhere. How many CPU threads a
stage computes with is no cluster setting: it is params.yaml's `threads`, so that outputs do not depend on where
a stage ran (`stages.runner`).

Kept out of params.yaml on purpose: the choice of machines must not make DVC rerun anything. The whole file is
validated before anything starts and every problem is reported at once, one line each naming the entry and key:
unknown keys, the type of every value (the jobqueue classes' own arguments too: `OPTION_TYPES`; a string where a
list belongs would become one `#SBATCH` line per character), an unquoted `walltime` that YAML read as a
number, required keys per kind, and what the jobqueue class itself refuses when it writes the job script. A SLURM
entry is then checked against the batch system without submitting anything (`check_submission`: `sbatch
--test-only` refuses an unknown partition, GRES, account or QOS, or sizes no node has), and a job the batch system
refuses at run time stops the flow within seconds with its message (`Submissions`). The cluster itself is built by
prefect-dask's `DaskTaskRunner` (cluster class, keyword arguments, adaptive scaling) and shut down with it.
"""

from __future__ import annotations

import inspect
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BeforeValidator, Field, Strict, ValidationError, create_model, field_validator, model_validator

from pipeline.settings import CONFIG, Bool, NonNegativeInt, PositiveFloat, PositiveInt, settings

#: the dask-jobqueue class of each batch-system kind
JOBQUEUE = {"slurm": "SLURMCluster", "pbs": "PBSCluster", "lsf": "LSFCluster", "sge": "SGECluster", "htcondor": "HTCondorCluster"}
#: what `cluster.job_script()` puts where the scheduler's address goes before the cluster starts
SCHEDULER_PLACEHOLDER = "tcp://<insert-scheduler-address-here>:8786"
#: jobqueue constructor arguments that the flow sets itself or that are no job settings
_NOT_OPTIONS = {"self", "scheduler", "name", "n_workers", "job_cls", "loop", "asynchronous", "dashboard_address", "host", "scheduler_cls"}
#: where batch jobs write their output unless an entry sets `log_directory` (relative to the project's root)
JOB_LOGS = "logs/jobs"


class ClusterError(ValueError):
    """The cluster file or the chosen cluster is wrong; one line per problem, naming the file and key."""


def _walltime(value: Any) -> Any:
    """A walltime must reach the job script as written: YAML reads an unquoted 12:00:00 as the base-60 integer
    43200, which SLURM would take as 43200 minutes."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = int(value)
        as_written = f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        raise ValueError(f"YAML read it as the number {value!r} (an unquoted {as_written} is a base-60 number in YAML); quote it, "
                         f"e.g. walltime: \"{as_written}\"")
    return value


Str = Annotated[str, Strict()]
StrList = list[Str]
Walltime = Annotated[str, Strict(), BeforeValidator(_walltime)]

#: the type of every keyword argument of the dask-jobqueue classes (a test checks that none is missing)
OPTION_TYPES: dict[str, Any] = {
    "cores": PositiveInt, "processes": PositiveInt, "memory": Str, "walltime": Walltime, "queue": Str, "account": Str,
    "project": Str, "job_name": Str, "interface": Str, "protocol": Str, "python": Str, "shebang": Str, "config_name": Str,
    "local_directory": Str, "log_directory": Str, "shared_temp_directory": Str, "worker_command": Str, "death_timeout": PositiveFloat,
    "nanny": Bool, "silence_logs": Str, "job_extra_directives": StrList, "job_script_prologue": StrList, "worker_extra_args": StrList,
    "job_directives_skip": StrList, "scheduler_options": dict[str, Any],
    "job_cpu": PositiveInt, "job_mem": Str,  # slurm
    "resource_spec": Str,  # pbs, sge
    "ncpus": PositiveInt, "mem": PositiveInt, "lsf_units": Str, "use_stdin": Bool,  # lsf
    "disk": Str, "submit_command_extra": StrList, "cancel_command_extra": StrList,  # htcondor
}
#: where a kind's argument has another type: HTCondor's extra directives are submit-file keys and values
KIND_OPTION_TYPES: dict[str, dict[str, Any]] = {"htcondor": {"job_extra_directives": dict[str, Str]}}
#: arguments that dask-jobqueue keeps only for old code, and what replaces them
DEPRECATED = {"env_extra": "job_script_prologue", "extra": "worker_extra_args", "header_skip": "job_directives_skip", "job_extra": "job_extra_directives"}
#: arguments the cluster file cannot express
UNSUPPORTED = {"security": "TLS settings are a distributed.Security object, not a cluster-file value"}
#: keys of older cluster files, and where they went
MOVED = {"threads": "CPU threads are params.yaml's `threads` now (the same for every stage wherever it runs, so outputs do not depend on "
                    "the cluster); remove it here"}


@settings
class LocalSettings:
    """`workers` stages at once on this machine (threads, or worker `processes`); `memory_limit` per worker as
    Dask takes it ("4GB", "auto"; default none); `dashboard` address of Dask's dashboard (null: none)."""

    kind: Literal["local"] = "local"
    workers: PositiveInt = 1
    processes: Bool = False
    memory_limit: Str | None = None
    dashboard: Str | None = ":8787"
    resources: dict[str, PositiveFloat] = Field(default_factory=dict)


@settings
class AddressSettings:
    """A running Dask scheduler (`tcp://host:8786`) whose workers see the project at the same path; `resources`
    declares what they were started with (`dask worker ADDRESS --resources GPU=1`)."""

    address: Str
    kind: Literal["address"] = "address"
    resources: dict[str, PositiveFloat] = Field(default_factory=dict)

    @field_validator("address")
    @classmethod
    def _scheme(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z]+://\S+", value):
            raise ValueError(f"expected a scheduler address such as tcp://host:8786, got {value!r}")
        return value


@settings
class JobqueueSettings:
    """Batch jobs through a dask-jobqueue class, between `min_jobs` and `max_jobs` jobs as the work needs them;
    `options`: the class's own keyword arguments (written flat in the cluster file, typed by `OPTION_TYPES`)."""

    kind: Literal["slurm", "pbs", "lsf", "sge", "htcondor"] = "slurm"
    min_jobs: NonNegativeInt = 0
    max_jobs: PositiveInt = 1
    options: dict[str, Any] = Field(default_factory=dict)
    resources: dict[str, PositiveFloat] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _jobs(self) -> "JobqueueSettings":
        if self.min_jobs > self.max_jobs:
            raise ValueError(f"min_jobs: {self.min_jobs} > max_jobs {self.max_jobs}")
        return self

    @property
    def cluster_class(self) -> Any:
        import dask_jobqueue

        return getattr(dask_jobqueue, JOBQUEUE[self.kind])

    def job_kwargs(self, root: Path | None) -> dict[str, Any]:
        """The class's keyword arguments: `--resources` added to the workers' arguments, the job logs in
        `log_directory` under the project's `root` (None: no log files, for checking a script without creating
        the folder), and the workers' profiler turned off after the job's own prologue (`PROFILER_OFF`)."""
        import dask

        kwargs = dict(self.options)
        prologue = kwargs.get("job_script_prologue")
        if prologue is None:
            prologue = dask.config.get(f"jobqueue.{self.cluster_class.job_cls.config_name}.job-script-prologue", default=None) or []
        kwargs["job_script_prologue"] = [*prologue, PROFILER_OFF]
        if self.resources:
            spec = ",".join(f"{name}={value:g}" for name, value in self.resources.items())
            kwargs["worker_extra_args"] = [*kwargs.get("worker_extra_args", []), "--resources", spec]
        kwargs["log_directory"] = None if root is None else str(Path(root, kwargs.get("log_directory", JOB_LOGS)).resolve())
        return kwargs

    def job_script(self, root: Path | None) -> str:
        """The batch script one job would run, from the class's job class, without starting a scheduler (with `root`,
        dask-jobqueue creates the log folder)."""
        return self.cluster_class.job_cls(SCHEDULER_PLACEHOLDER, name="dummy-name", **self.job_kwargs(root)).job_script()


#: the batch jobs' workers run without distributed's statistical profiler (see `open_cluster`)
PROFILER_OFF = "export DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False"

Cluster = LocalSettings | AddressSettings | JobqueueSettings
KINDS: dict[str, type] = {"local": LocalSettings, "address": AddressSettings, **dict.fromkeys(JOBQUEUE, JobqueueSettings)}


def jobqueue_options(kind: str) -> set[str]:
    """The keyword arguments the dask-jobqueue class of `kind` and its job class take."""
    import dask_jobqueue
    from dask_jobqueue.core import Job

    cls = getattr(dask_jobqueue, JOBQUEUE[kind])
    classes = [c for c in cls.__mro__ if issubclass(c, dask_jobqueue.JobQueueCluster)]
    classes += [c for c in cls.job_cls.__mro__ if issubclass(c, Job)]
    return {p.name for c in classes if "__init__" in vars(c) for p in inspect.signature(c.__init__).parameters.values()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)} - _NOT_OPTIONS


def _options_model(kind: str) -> Any:
    """A pydantic model of the jobqueue class's arguments for `kind`, each optional and typed by OPTION_TYPES."""
    types = {**OPTION_TYPES, **KIND_OPTION_TYPES.get(kind, {})}
    fields = {name: (types[name] | None, None) for name in sorted(jobqueue_options(kind) - set(DEPRECATED) - set(UNSUPPORTED))}
    return create_model(f"{JOBQUEUE[kind]}Options", __config__=CONFIG, **fields)


def parse_cluster(name: str, raw: Any, source: str) -> Cluster:
    """One entry of the cluster file; ClusterError with one line per problem, each naming `source: name.key`.
    Every problem of the entry is reported, not only the first; a jobqueue entry whose values are all well typed
    also has its job script written once (without creating its log folder), so that the class's own checks of
    the values (cores, memory, ...) run now."""
    if not isinstance(raw, dict):
        raise ClusterError(f"{source}: {name}: expected a mapping with a `kind`, got {type(raw).__name__}")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise ClusterError(f"{source}: {name}.kind: unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    problems = [f"{source}: {name}.{key}: {why}" for key, why in MOVED.items() if key in raw]
    values = {k: v for k, v in raw.items() if k not in MOVED}
    options_model = None
    if KINDS[kind] is JobqueueSettings:
        own = {f.name for f in JobqueueSettings.__dataclass_fields__.values()} - {"options"}
        allowed = jobqueue_options(kind)
        for key in sorted(set(values) - own):
            if key in DEPRECATED:
                problems.append(f"{source}: {name}.{key}: deprecated by dask-jobqueue; write `{DEPRECATED[key]}` instead")
            elif key in UNSUPPORTED:
                problems.append(f"{source}: {name}.{key}: not supported here: {UNSUPPORTED[key]}")
            elif key not in allowed:
                problems.append(f"{source}: {name}.{key}: unknown key (neither a flow setting nor a {JOBQUEUE[kind]} argument)")
        options = {k: v for k, v in values.items() if k not in own and k in allowed and k not in DEPRECATED and k not in UNSUPPORTED}
        values = {k: v for k, v in values.items() if k in own} | {"options": options}
        options_model = _options_model(kind)
        try:
            options_model(**options)
        except ValidationError as e:
            problems += [f"{source}: {'.'.join(str(p) for p in (name, *error['loc']))}: {_message(error, kind)}" for error in e.errors()]
    try:
        cluster = KINDS[kind](**values)
    except ValidationError as e:
        problems += [f"{source}: {'.'.join(str(p) for p in (name, *error['loc']))}: {_message(error, kind)}" for error in e.errors()]
    if problems:
        raise ClusterError("\n".join(problems))
    if isinstance(cluster, JobqueueSettings):
        try:
            cluster.job_script(None)
        except (ValueError, TypeError) as e:
            raise ClusterError(f"{source}: {name}: {JOBQUEUE[cluster.kind]}: {' '.join(str(e).split())}") from None
    return cluster


def _message(error: dict, kind: str) -> str:
    if error["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
        return "unknown key"
    if error["type"] in ("missing", "missing_argument"):
        return f"missing: a cluster of kind {kind} needs it"
    if error["type"] == "list_type" and isinstance(error["input"], str):
        return f"expected a list of strings, got the string {error['input']!r} (write [{json.dumps(error['input'])}])"
    message = error["msg"].removeprefix("Value error, ")
    return message if error["type"] == "value_error" else f"{message} (got {error['input']!r})"


def load_clusters(path: Path) -> dict[str, Cluster]:
    """Every cluster of the file at `path`; ClusterError with every problem of every entry, one line each."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ClusterError(f"{path}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ClusterError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', None) or str(e).splitlines()[0]}") from None
    if not isinstance(raw, dict) or not raw:
        raise ClusterError(f"{path}: expected a mapping of cluster names to clusters, got {type(raw).__name__}")
    clusters, problems = {}, []
    for name, entry in raw.items():
        try:
            clusters[str(name)] = parse_cluster(str(name), entry, str(path))
        except ClusterError as e:
            problems.append(str(e))
    if problems:
        raise ClusterError("\n".join(problems))
    return clusters


def choose_cluster(path: Path, name: str = "local", address: str | None = None) -> Cluster:
    """The cluster the flow runs on: `address` (an existing scheduler) if given, else entry `name` of the cluster
    file at `path` (the whole file validated); without a file, `local` is one local worker (stages one after
    another, as `dvc repro`)."""
    if address is not None:
        return parse_cluster("--dask", {"kind": "address", "address": address}, "cedar flow")
    if not Path(path).exists():
        if name == "local":
            return LocalSettings()
        raise ClusterError(f"{path}: no such file, so no cluster {name!r} (the project ships an example cluster.yaml)")
    clusters = load_clusters(path)
    if name not in clusters:
        raise ClusterError(f"{path}: no cluster {name!r}; it has {', '.join(clusters)}")
    return clusters[name]


def default_batch_cluster(path: Path) -> str:
    """The name of the first batch-system entry of the cluster file (what `cedar cluster script` shows by default)."""
    clusters = load_clusters(path)
    batch = [name for name, cluster in clusters.items() if isinstance(cluster, JobqueueSettings)]
    if not batch:
        raise ClusterError(f"{path}: no batch-system cluster (slurm, pbs, lsf, sge, htcondor) among {', '.join(clusters)}")
    return batch[0]


def check_submission(cluster: Cluster, where: str, required: bool = False) -> str | None:
    """Ask the batch system whether it would accept a job of `cluster`, submitting nothing: for SLURM, `sbatch
    --test-only` on the job script (it checks the partition, GRES, account, QOS and sizes against the nodes).
    ClusterError with sbatch's own message when it would refuse, or, when the flow is to run (`required`), when
    there is no sbatch here; else a note when nothing could be checked (not SLURM, or no sbatch), or None."""
    if not isinstance(cluster, JobqueueSettings):
        return None
    if cluster.kind != "slurm":
        return f"{where}: a {cluster.kind} job cannot be checked before it is submitted; its script is valid"
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        if required:
            raise ClusterError(f"{where}: sbatch is not on PATH: run the flow where SLURM's commands are (a login node)")
        return f"{where}: sbatch is not on PATH here, so the partition and resources were not checked against SLURM"
    with tempfile.NamedTemporaryFile("w", suffix=".sh", prefix="cedar-job-") as script:
        script.write(cluster.job_script(None))
        script.flush()
        try:
            result = subprocess.run([sbatch, "--test-only", script.name], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            raise ClusterError(f"{where}: `sbatch --test-only` did not answer within 60 s (is slurmctld up?)") from None
    if result.returncode != 0:
        raise ClusterError(f"{where}: `sbatch --test-only` refuses its job: {_one_line(result.stderr or result.stdout)}")
    return None


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.strip().splitlines() if line.strip()) or "(no message)"


@dataclass
class Submissions:
    """What the batch system said when it refused a job of the running cluster (None while it has refused none).

    dask-jobqueue submits jobs from its adaptive loop and only logs a refusal, so the cluster would wait for
    workers that never come; the flow's tasks read `refused` while they wait and stop at once."""

    where: str
    refused: str | None = None

    def refuse(self, error: BaseException) -> None:
        if self.refused is None:
            text = str(error)
            self.refused = _one_line(text.split("stderr:", 1)[1] if "stderr:" in text else text)

    def check(self) -> None:
        """SubmissionError naming the cluster entry and the batch system's message, once a job was refused."""
        if self.refused is not None:
            raise SubmissionError(f"{self.where}: the batch system refused a job: {self.refused}")


class SubmissionError(RuntimeError):
    """A batch job of the flow's cluster could not be submitted; the message is the batch system's, in one line."""


def _reporting_job(job_cls: type, submissions: Submissions) -> type:
    """`job_cls` whose failed submission is reported to `submissions` (and still raised, as before); the job is then
    marked failed, as closing the cluster expects of every job it created (one left "created" fails the close)."""
    from distributed.core import Status

    class ReportingJob(job_cls):  # type: ignore[misc, valid-type]
        async def start(self) -> None:
            try:
                await super().start()
            except Exception as e:
                submissions.refuse(e)
                self.status = Status.failed
                raise

    ReportingJob.__name__ = ReportingJob.__qualname__ = f"Reporting{job_cls.__name__}"
    return ReportingJob


def task_runner(cluster: Cluster, root: Path, submissions: Submissions | None = None) -> Any:
    """prefect-dask's DaskTaskRunner for `cluster` (not started: entering it builds the cluster lazily); a jobqueue
    cluster's jobs report a refused submission to `submissions` and log to their folder under `root`."""
    from prefect_dask import DaskTaskRunner

    if isinstance(cluster, AddressSettings):
        return DaskTaskRunner(address=cluster.address)
    if isinstance(cluster, LocalSettings):
        kwargs = {"n_workers": cluster.workers, "threads_per_worker": 1, "processes": cluster.processes, "dashboard_address": cluster.dashboard,
                  "resources": dict(cluster.resources) or None}
        if cluster.memory_limit is not None:
            kwargs["memory_limit"] = cluster.memory_limit
        return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs=kwargs)
    kwargs = cluster.job_kwargs(root)
    if submissions is not None:
        kwargs["job_cls"] = _reporting_job(cluster.cluster_class.job_cls, submissions)
    return DaskTaskRunner(cluster_class=cluster.cluster_class, cluster_kwargs=kwargs,
                          adapt_kwargs={"minimum_jobs": cluster.min_jobs, "maximum_jobs": cluster.max_jobs})


@contextmanager
def open_cluster(cluster: Cluster, root: Path, where: str) -> Iterator[tuple[Any, Submissions]]:
    """A Dask client of `cluster` and its `Submissions` (`where`: the entry's name, for messages), started on entry
    and shut down (workers, jobs, scheduler) on exit.

    The scheduler gives up on a task at the first worker that dies under it (`allowed-failures: 0`), so that the
    flow's task, which counts retries, resubmits it (a remote `address` scheduler keeps its own setting). The local
    workers' statistical profiler is off: on Python 3.11 its `sys._current_frames()` every 10 ms can run distributed's
    GC callback while it holds the interpreter's thread-list lock, and a flow whose workers are threads of its own
    process then deadlocks as soon as it starts a thread (dask/distributed#8616; seen here: a 160-stage flow hung with
    every thread waiting for the GIL). The stages' commands run in their own processes, so the profile showed nothing.
    Batch jobs' workers get the same setting from their job script (`PROFILER_OFF`). Every worker, the ones that join
    later too, gets `QuietClose`: closing, it does not log distributed's heartbeat race as an error."""
    import logging

    import dask

    from flow.worker_logs import QuietClose

    submissions = Submissions(where)
    runner = task_runner(cluster, root, submissions)  # imports distributed, whose defaults dask.config.set must not come before
    logging.getLogger("distributed").setLevel(logging.WARNING)  # its scheduler's and workers' news are not for the console
    if isinstance(cluster, JobqueueSettings):  # a refused job is reported once, by the flow, not by every adaptive round
        logging.getLogger("distributed.deploy").setLevel(logging.CRITICAL)
    with dask.config.set({"distributed.scheduler.allowed-failures": 0, "distributed.worker.profile.enabled": False}), runner:
        runner.client.register_plugin(QuietClose())
        yield runner.client, submissions

