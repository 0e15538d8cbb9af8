"""The Prefect flow: DVC's stale stages as Prefect tasks, their commands on a Dask cluster, one writer of dvc.lock.

`pipeline_flow` asks DVC for the plan (`flow.graph`: the stale stages and those downstream of them, in
DVC's order), starts the cluster (`flow.cluster`), and submits one Prefect task per stage, named after it
(`sae@topk-256-16`), waiting for the stages it depends on; independent stages run at once. Each task lives in the
flow's own process: it asks DVC whether its stage is still stale, sends the stage's dvc.yaml commands to a Dask
worker that has the resources the stage asks for (`flow.command`), and, when they succeed, records the stage
in dvc.lock (only when every output exists). So only this process talks to the Prefect API and writes dvc.lock;
workers need neither a route to the Prefect server nor Prefect itself, only the project at the same path.

Faults: a stage whose command fails, whose process is killed or whose worker dies is retried (`retries`, default
2); training resumes from its last epoch checkpoint and extraction from its last chunk. Stages that finished stay
recorded when another fails; the flow then fails, naming the failed stages, and a rerun runs only what is left.
A batch job that cannot be submitted (the batch system refuses it) fails every waiting stage within a second,
without retries, and the flow stops with the batch system's message and the cluster's name.

The Prefect API: Prefect's temporary server (a child of this process, kept offline and inside the project by
`flow.configure_prefect_env`) or, for large flows, the project's server (`flow.server`). If the API is lost
while the flow runs, `flow.server.ApiWatch` notices within seconds: the flow says so in one line, the stages go
on and are recorded in dvc.lock as usual, and the process exits when they are done, without the Prefect calls
that would wait for the lost API. At the end the flow publishes the report's path and the headline metrics of the
grid as Prefect artifacts.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import prefect.settings
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_link_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import wait
from prefect.settings import PREFECT_API_URL, temporary_settings

from flow import PREFECT_DEFAULTS
from flow.cluster import Cluster, SubmissionError, Submissions, choose_cluster, open_cluster
from flow.command import run_commands
from flow.graph import PlannedStage, Project, StageError, set_params
from flow.server import ApiWatch
from pipeline.config import load_params
from pipeline.paths import Layout
from pipeline.report.tables import best_score

FLOW_NAME = "cedar-pipeline"


class FlowError(StageError):
    """Some stages failed; the message names them (the stages that finished are recorded in dvc.lock)."""


def _retryable(_task: Any, _run: Any, state: Any) -> bool:
    """Prefect's retry condition: everything but a refused batch job (resubmitting would be refused again)."""
    return not isinstance(state.data, SubmissionError)


@task(cache_policy=NO_CACHE, retry_delay_seconds=1, retry_condition_fn=_retryable)
def run_stage(stage: PlannedStage, project: Project, client: Any, submissions: Submissions, resources: dict[str, float]) -> str:
    """One DVC stage: "ran", "unchanged" (DVC found it up to date when its turn came) or "restored" (from DVC's
    run cache). Its command runs on a Dask worker offering `resources`; the stage is recorded here, in the driver.
    SubmissionError as soon as the cluster's batch system has refused a job (`submissions`)."""
    logger = get_run_logger()
    start = time.perf_counter()
    future = project.in_flight.get(stage.name)
    if future is not None and future.status in ("pending", "finished"):
        # an earlier attempt of this task failed while its command ran on (its wait failed, not the command): the
        # command is not started again beside itself, this attempt takes its result
        print(f"Stage '{stage.name}': waiting for the command an earlier attempt started", flush=True)
    else:
        status = project.start(stage.name)
        if status != "run" and stage.name in project.commands_ran:
            return "ran"  # an earlier attempt of this task ran it and lost its end (the Prefect API went away): its outputs are kept
        if status != "run":
            print(f"Stage '{stage.name}' {'did not change' if status == 'unchanged' else 'was restored from the run cache'}, skipping", flush=True)
            return status
        print(f"Running stage '{stage.name}'", flush=True)
        future = client.submit(run_commands, stage.name, list(stage.commands), stage.wdir, str(project.root),
                               resources=resources or None, key=f"{stage.name}-{uuid.uuid4().hex[:8]}", pure=False)
        project.in_flight[stage.name] = future
    outcome = result(future, submissions)
    del project.in_flight[stage.name]
    project.commands_ran.add(stage.name)
    # Let go of the finished task before recording it: while this client holds the future, Dask keeps its result on
    # the worker that ran it, and recomputes it (running the stage's command a second time, after it was recorded)
    # when the adaptive cluster retires that worker (seen on SLURM: dvc status then named the rewritten timings).
    future.release()
    logger.info("%s", outcome)
    project.record(stage.name)
    print(f"Stage '{stage.name}' finished in {time.perf_counter() - start:.1f} s and is recorded in dvc.lock", flush=True)
    return "ran"


def result(future: Any, submissions: Submissions) -> Any:
    """The Dask future's result, checking every second while it runs that the cluster's batch system has refused no
    job (SubmissionError ends the wait).

    The wait is a done-callback's event, not `future.result(timeout=1)` in a loop: distributed's timed wait raises
    UnboundLocalError when its timeout's cancellation races the result (distributed 2026.8, seen under load), which
    failed the task's attempt while its command went on running."""
    done = threading.Event()
    future.add_done_callback(lambda _: done.set())
    while not done.wait(1):
        submissions.check()
    return future.result()


def run_plan(plan: list[PlannedStage], project: Project, cluster: Cluster, retries: int, where: str) -> dict[str, str]:
    """Submit every planned stage after the stages it needs; returns each stage's outcome, or raises FlowError
    (where: the cluster's name, for the message of a refused batch job)."""
    logging.getLogger("dvc").setLevel(logging.WARNING)  # its "Updating lock file" lines: run_stage prints its own
    futures = {}
    with open_cluster(cluster, project.root, where) as (client, submissions):
        for stage in plan:
            offered = {name: amount for name, amount in stage.resources.items() if name in cluster.resources}
            task_ = run_stage.with_options(name=stage.name.split("@")[0], task_run_name=stage.name, retries=retries)
            futures[stage.name] = task_.submit(stage, project, client, submissions, offered, wait_for=[futures[n] for n in stage.needs])
        wait(list(futures.values()))
    outcome = {name: future.result() if future.state.is_completed() else "failed" for name, future in futures.items()}
    failed = [name for name, future in futures.items() if future.state.is_failed() or future.state.is_crashed()]
    if submissions.refused is not None:
        done = sum(status != "failed" for status in outcome.values())
        raise FlowError(f"{where}: the batch system refused a job: {submissions.refused}; {done} of {len(plan)} stages finished and are "
                        "recorded in dvc.lock")
    if failed:
        waiting = [name for name, status in outcome.items() if status == "failed" and name not in failed]
        raise FlowError(f"failed stages: {', '.join(failed)}" + (f"; not run: {', '.join(waiting)}" if waiting else "")
                        + "; the finished stages are recorded in dvc.lock, rerun the flow to finish the rest")
    return outcome


def headline(root: Path) -> list[dict[str, Any]]:
    """One row per evaluated grid cell: its size, k and trained FVU, L0, dead fraction and objects MATCHScore."""
    params, layout = load_params(root / "params.yaml"), Layout(root)
    rows = []
    for cell in params.cells():
        path = layout.run_metrics(cell.name)
        if path.is_file():
            metrics = json.loads(path.read_text())
            trained = metrics["trained"]
            score = best_score(metrics)
            rows.append({"run": cell.name, "latents": metrics["size"], "k": metrics["k"], "fvu": trained["fvu"], "l0": trained["l0"],
                         "dead_fraction": trained["dead_fraction"], "match_score": None if score == float("-inf") else score})
    return rows


def publish(root: Path) -> None:
    """The report's path and the headline metrics table as Prefect artifacts of this flow run."""
    report = Layout(root).report.resolve()
    if report.is_file():
        create_link_artifact(key="cedar-report", link=report.as_uri(), link_text=str(report), description="The HTML report of this run")
    rows = headline(root)
    if rows:
        create_table_artifact(key="cedar-metrics", table=rows, description="Headline metrics per grid cell (trained model)")


@flow(name=FLOW_NAME)
def pipeline_flow(targets: list[str] | None = None, overrides: list[str] | None = None, cluster: str = "local", cluster_file: str = "cluster.yaml",
                  dask_address: str | None = None, retries: int = 2, root: str = ".") -> dict[str, str]:
    """Run the stale DVC stages (of `targets`, default all) on `cluster` from `cluster_file` (relative to `root`)
    or on the scheduler at `dask_address`, after applying `-S` `overrides` to params.yaml; returns what each
    planned stage did ("ran", "unchanged", "restored")."""
    base = Path(root).resolve()
    if overrides:
        set_params(base / "params.yaml", overrides)
    load_params(base / "params.yaml")  # bad params fail before any work
    chosen = choose_cluster(base / cluster_file, cluster, dask_address)
    where = f"--dask {dask_address}" if dask_address else f"{cluster_file}: {cluster}"
    project = Project(base)
    try:
        with ApiWatch(api_url(), on_lost=_api_lost) as watch:
            try:
                plan = project.plan(targets)
                outcome = run_plan(plan, project, chosen, retries, where) if plan else {}
            except StageError as e:
                if not watch.lost:
                    raise
                exit_without_api(f"error: {e}", 1)
    finally:
        project.close()
    if watch.lost:
        exit_without_api(summary(outcome, base), 0)
    publish(base)
    return outcome


def api_url() -> str:
    """The address of the Prefect API this flow run reports to (the temporary server's, the project's or the user's)."""
    from prefect.context import FlowRunContext

    return str(FlowRunContext.get().client.api_url)


def _api_lost(url: str) -> None:
    """The flow's one line about a lost Prefect API; Prefect's clients retrying it are silenced from now on (its
    internal loggers ignore `logging.disable`, so they are disabled one by one)."""
    print(f"The Prefect API at {url} is lost: the stages go on and are recorded in dvc.lock, and the flow exits when they are done "
          "(its Prefect record stays incomplete)", file=sys.stderr, flush=True)
    logging.disable(logging.CRITICAL)
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if name.startswith("prefect") and isinstance(logger, logging.Logger):
            logger.disabled = True


def exit_without_api(message: str, status: int) -> None:
    """End the process now, after the stages are done and recorded: the flow's final Prefect calls (its state, its
    artifacts, the events still queued) would wait for the lost API."""
    print(message, file=sys.stderr if status else sys.stdout, flush=True)
    sys.stderr.flush()
    os._exit(status)


def summary(outcome: dict[str, str], root: Path) -> str:
    """The flow's last line: how many planned stages ran, and where the report is."""
    ran = [name for name, status in outcome.items() if status == "ran"]
    return f"Ran {len(ran)} of {len(outcome)} planned stages; report: {Layout(root).report}"


@contextmanager
def prefect_settings() -> Iterator[None]:
    """The environment's Prefect variables (`configure_prefect_env`, PREFECT_API_URL) as this process's Prefect
    settings while the block runs. Prefect reads its environment once, when it is first imported: a process that
    imported it earlier (a notebook, the test suite) would otherwise keep its own home, API and the temporary
    server's 20-second start-up limit (seen: a flow on a loaded CI machine failed at 20 s)."""
    keys = ["PREFECT_HOME", "PREFECT_API_URL", *PREFECT_DEFAULTS]
    updates = {getattr(prefect.settings, key): os.environ[key] for key in keys if key in os.environ and hasattr(prefect.settings, key)}
    with temporary_settings(updates):
        yield


def serve(name: str, parameters: dict[str, Any], cron: str | None, interval: float | None) -> None:
    """`cedar serve`: serve the flow as deployment `cedar-pipeline/<name>` until interrupted; runs start from the
    Prefect UI or `prefect deployment run` (parameters such as `overrides` as in `dvc exp run -S`) or on the
    schedule. Without PREFECT_API_URL, it starts Prefect's temporary local server and prints its address."""
    url = os.environ.get("PREFECT_API_URL")
    server = None
    if not url:
        from prefect.server.api.server import SubprocessASGIServer

        server = SubprocessASGIServer()
        server.start()
        url = os.environ["PREFECT_API_URL"] = server.api_url
        print(f"Prefect API: {url} (a temporary local server; start runs with PREFECT_API_URL={url} "
              f"prefect deployment run {FLOW_NAME}/{name})", flush=True)
    try:
        with temporary_settings({PREFECT_API_URL: url}):
            pipeline_flow.serve(name=name, parameters=parameters, cron=cron, interval=interval)
    finally:
        if server is not None:
            server.stop()
