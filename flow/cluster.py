"""Where the flow runs stages: the cluster file (cluster.yaml), its validation, and the Dask cluster it describes.

The cluster file maps names to clusters (`cedar flow --cluster NAME`, default `local`); each has a `kind`:

- `local`: a `distributed.LocalCluster` on this machine, `workers` stages at once, as threads (default: the work
  is in each stage's own process anyway) or `processes: true`;
- `address`: an existing Dask scheduler (`cedar flow --dask ADDRESS` is the shortcut);
- `slurm`, `pbs`, `lsf`, `sge`, `htcondor`: the dask-jobqueue class of that name, with its own keyword arguments
  written flat in the entry (`queue`, `cores`, `memory`, `walltime`, `job_extra_directives`, ...), scaled
  adaptively between `min_jobs` and `max_jobs` batch jobs.

Every kind also takes `resources` (the Dask resources each worker offers, e.g. `{GPU: 1}`: given to the workers
it starts, declared for an `address` scheduler's) and `threads` (CPU threads of each stage process; default: as
`dvc repro` from the same shell, see `flow.command`). A stage that asks for a resource in dvc.yaml
(`meta: {resources: {GPU: 1}}`) gets it only on a cluster that offers it, so on a GPU cluster training and
extraction go only to GPU workers, one per GPU, and elsewhere every stage runs anywhere.

Kept out of params.yaml on purpose: the choice of machines must not make DVC rerun anything. Validated like
params (`pipeline.settings`): unknown keys and bad values fail with one line per problem naming the key, before
anything starts. The cluster itself is built by prefect-dask's `DaskTaskRunner` (cluster class, keyword
arguments, adaptive scaling) and shut down with it.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from pipeline.settings import Bool, NonNegativeInt, PositiveFloat, PositiveInt, settings

#: the dask-jobqueue class of each batch-system kind
JOBQUEUE = {"slurm": "SLURMCluster", "pbs": "PBSCluster", "lsf": "LSFCluster", "sge": "SGECluster", "htcondor": "HTCondorCluster"}
#: what `cluster.job_script()` puts where the scheduler's address goes before the cluster starts
SCHEDULER_PLACEHOLDER = "tcp://<insert-scheduler-address-here>:8786"
#: jobqueue constructor arguments that the flow sets itself or that are no job settings
_NOT_OPTIONS = {"self", "scheduler", "name", "n_workers", "job_cls", "loop", "asynchronous", "dashboard_address", "host", "scheduler_cls"}


class ClusterError(ValueError):
    """The cluster file or the chosen cluster is wrong; one line per problem, naming the file and key."""


@settings
class LocalSettings:
    """`workers` stages at once on this machine (threads, or worker `processes`); `memory_limit` per worker as
    Dask takes it ("4GB", "auto"; default none); `dashboard` address of Dask's dashboard (null: none)."""

    kind: Literal["local"] = "local"
    workers: PositiveInt = 1
    processes: Bool = False
    memory_limit: str | None = None
    dashboard: str | None = ":8787"
    resources: dict[str, PositiveFloat] = Field(default_factory=dict)
    threads: PositiveInt | None = None


@settings
class AddressSettings:
    """A running Dask scheduler (`tcp://host:8786`) whose workers see the project at the same path; `resources`
    declares what they were started with (`dask worker ADDRESS --resources GPU=1`)."""

    kind: Literal["address"] = "address"
    address: str = ""
    resources: dict[str, PositiveFloat] = Field(default_factory=dict)
    threads: PositiveInt | None = None

    @field_validator("address")
    @classmethod
    def _scheme(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z]+://\S+", value):
            raise ValueError(f"expected a scheduler address such as tcp://host:8786, got {value!r}")
        return value


@settings
class JobqueueSettings:
    """Batch jobs through a dask-jobqueue class, between `min_jobs` and `max_jobs` jobs as the work needs them;
    `options`: the class's own keyword arguments (written flat in the cluster file, checked against the class)."""

    kind: Literal["slurm", "pbs", "lsf", "sge", "htcondor"] = "slurm"
    min_jobs: NonNegativeInt = 0
    max_jobs: PositiveInt = 1
    options: dict[str, Any] = Field(default_factory=dict)
    resources: dict[str, PositiveFloat] = Field(default_factory=dict)
    threads: PositiveInt | None = None

    @model_validator(mode="after")
    def _jobs(self) -> "JobqueueSettings":
        if self.min_jobs > self.max_jobs:
            raise ValueError(f"min_jobs: {self.min_jobs} > max_jobs {self.max_jobs}")
        return self

    @property
    def cluster_class(self) -> Any:
        import dask_jobqueue

        return getattr(dask_jobqueue, JOBQUEUE[self.kind])

    def job_kwargs(self) -> dict[str, Any]:
        """The class's keyword arguments, with `--resources` added to the workers' arguments."""
        kwargs = dict(self.options)
        if self.resources:
            spec = ",".join(f"{name}={value:g}" for name, value in self.resources.items())
            kwargs["worker_extra_args"] = [*kwargs.get("worker_extra_args", []), "--resources", spec]
        return kwargs

    def job_script(self) -> str:
        """The batch script one job would run, from the class's job class, without starting a scheduler."""
        return self.cluster_class.job_cls(SCHEDULER_PLACEHOLDER, name="dummy-name", **self.job_kwargs()).job_script()


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


def parse_cluster(name: str, raw: Any, source: str) -> Cluster:
    """One entry of the cluster file; ClusterError naming `source: name.key` for each problem."""
    if not isinstance(raw, dict):
        raise ClusterError(f"{source}: {name}: expected a mapping with a `kind`, got {type(raw).__name__}")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise ClusterError(f"{source}: {name}.kind: unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    values = dict(raw)
    if KINDS[kind] is JobqueueSettings:
        own = {f.name for f in JobqueueSettings.__dataclass_fields__.values()} - {"options"}
        allowed = jobqueue_options(kind)
        unknown = sorted(set(values) - own - allowed)
        if unknown:
            raise ClusterError("\n".join(f"{source}: {name}.{key}: unknown key (neither a flow setting nor a {JOBQUEUE[kind]} argument)"
                                         for key in unknown))
        values = {k: v for k, v in values.items() if k in own} | {"options": {k: v for k, v in values.items() if k not in own}}
    try:
        return KINDS[kind](**values)
    except ValidationError as e:
        raise ClusterError("\n".join(f"{source}: {'.'.join(str(p) for p in (name, *error['loc']))}: {_message(error)}" for error in e.errors())) from None
    except TypeError as e:  # an unknown keyword of a dataclass
        raise ClusterError(f"{source}: {name}: {e}") from None


def _message(error: dict) -> str:
    if error["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
        return "unknown key"
    message = error["msg"].removeprefix("Value error, ")
    return message if error["type"] in ("value_error", "missing") else f"{message} (got {error['input']!r})"


def load_clusters(path: Path) -> dict[str, Cluster]:
    """Every cluster of the file at `path`; ClusterError (one line per problem) when it is malformed."""
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
    file at `path`; without a file, `local` is one local worker (stages one after another, as `dvc repro`)."""
    if address is not None:
        return parse_cluster("--dask", {"kind": "address", "address": address}, "cedar flow")
    if not Path(path).exists():
        if name == "local":
            return LocalSettings()
        raise ClusterError(f"{path}: no such file, so no cluster {name!r} (the project ships an example cluster.yaml)")
    clusters = load_clusters(path)
    if name not in clusters:
        raise ClusterError(f"{path}: no cluster {name!r}; it has {', '.join(clusters)}")
    cluster = clusters[name]
    if isinstance(cluster, JobqueueSettings):
        check_jobqueue(cluster, f"{path}: {name}")
    return cluster


def check_jobqueue(cluster: JobqueueSettings, where: str) -> None:
    """Build the job script once, as the dask-jobqueue class does when it starts: its own checks of the
    values (cores, memory, ...) fail here, in one line, before any job is submitted."""
    try:
        cluster.job_script()
    except (ValueError, TypeError) as e:
        raise ClusterError(f"{where}: {JOBQUEUE[cluster.kind]}: {' '.join(str(e).split())}") from None


def task_runner(cluster: Cluster) -> Any:
    """prefect-dask's DaskTaskRunner for `cluster` (not started: entering it builds the cluster lazily)."""
    from prefect_dask import DaskTaskRunner

    if isinstance(cluster, AddressSettings):
        return DaskTaskRunner(address=cluster.address)
    if isinstance(cluster, LocalSettings):
        kwargs = {"n_workers": cluster.workers, "threads_per_worker": 1, "processes": cluster.processes, "dashboard_address": cluster.dashboard,
                  "resources": dict(cluster.resources) or None}
        if cluster.memory_limit is not None:
            kwargs["memory_limit"] = cluster.memory_limit
        return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs=kwargs)
    return DaskTaskRunner(cluster_class=cluster.cluster_class, cluster_kwargs=cluster.job_kwargs(),
                          adapt_kwargs={"minimum_jobs": cluster.min_jobs, "maximum_jobs": cluster.max_jobs})


@contextmanager
def open_cluster(cluster: Cluster) -> Iterator[Any]:
    """A Dask client of `cluster`, started on entry and shut down (workers, jobs, scheduler) on exit.

    The scheduler gives up on a task at the first worker that dies under it (`allowed-failures: 0`), so that the
    flow's task, which counts retries, resubmits it (a remote `address` scheduler keeps its own setting)."""
    import logging

    import dask

    runner = task_runner(cluster)  # imports distributed, whose defaults dask.config.set must not come before
    logging.getLogger("distributed").setLevel(logging.WARNING)  # its scheduler's and workers' news are not for the console
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), runner:
        yield runner.client
