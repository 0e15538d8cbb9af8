"""The Prefect flow: the same stage functions as `dvc repro`, in DAG order, on one machine or a Dask cluster.

DVC decides *what* is stale; this flow decides *where and when* work runs. It runs the whole
graph (scenes -> encoder -> extract -> train per grid cell, and the caption decoder -> evaluate per grid
cell, and the planted recovery benchmark -> report);
grid cells run concurrently on the task runner: threads locally (`workers`), or a Dask cluster
(`dask_address`, through prefect-dask) where every worker sees the same project directory.

Prefect needs no server: with PREFECT_API_URL unset it starts a temporary local one.
`configure_prefect_env` sets the settings that keep that offline and inside the project.
"""

from __future__ import annotations

import os
from pathlib import Path

from prefect import flow, task
from prefect.task_runners import ThreadPoolTaskRunner

from pipeline.config import load_params
from pipeline.paths import Layout


def configure_prefect_env(root: Path = Path(".")) -> None:
    """Offline, project-local Prefect settings (only those the user has not set already)."""
    defaults = {
        "PREFECT_HOME": str((Path(root) / ".prefect").resolve()),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


@task(name="data")
def data_task(params_path: str, root: str) -> None:
    from stages import data

    data.run(load_params(params_path), Layout(Path(root)))


@task(name="encoder")
def encoder_task(params_path: str, root: str) -> None:
    from stages import encoder

    encoder.run(load_params(params_path), Layout(Path(root)))


@task(name="extract")
def extract_task(params_path: str, root: str) -> None:
    from stages import extract

    extract.run(load_params(params_path), Layout(Path(root)))


@task(name="captions")
def captions_task(params_path: str, root: str) -> None:
    from stages import captions

    captions.run(load_params(params_path), Layout(Path(root)))


@task(name="train", task_run_name="train@{method}-{size}-{k}")
def train_task(params_path: str, root: str, method: str, size: int, k: int) -> None:
    from stages import train

    params = load_params(params_path)
    train.run(params, Layout(Path(root)), params.cell(method, size, k))


@task(name="evaluate", task_run_name="evaluate@{method}-{size}-{k}")
def evaluate_task(params_path: str, root: str, method: str, size: int, k: int) -> None:
    from stages import evaluate

    params = load_params(params_path)
    evaluate.run(params, Layout(Path(root)), params.cell(method, size, k))


@task(name="planted")
def planted_task(params_path: str, root: str) -> None:
    from stages import planted

    planted.run(load_params(params_path), Layout(Path(root)))


@task(name="report")
def report_task(params_path: str, root: str) -> str:
    from stages import report

    report.run(load_params(params_path), Layout(Path(root)), Path(params_path).read_text())
    return str(Layout(Path(root)).report)


@flow(name="cedar-pipeline")
def pipeline_flow(params_path: str = "params.yaml", root: str = ".") -> str:
    """Run every stage; returns the report path. Grid cells are submitted concurrently."""
    params = load_params(params_path)  # fail on bad params before any work
    root = str(Path(root).resolve())
    params_path = str(Path(params_path).resolve())
    data = data_task.submit(params_path, root)
    encoder = encoder_task.submit(params_path, root, wait_for=[data])
    extract = extract_task.submit(params_path, root, wait_for=[encoder])
    decoder = captions_task.submit(params_path, root, wait_for=[extract])
    evaluations = []
    for cell in params.cells():
        trained = train_task.submit(params_path, root, cell.method, cell.size, cell.k, wait_for=[extract])
        evaluations.append(evaluate_task.submit(params_path, root, cell.method, cell.size, cell.k, wait_for=[trained, decoder]))
    planted = planted_task.submit(params_path, root)
    return report_task.submit(params_path, root, wait_for=[*evaluations, planted]).result()


def run_flow(params_path: str = "params.yaml", root: str = ".", workers: int = 1, dask_address: str | None = None) -> str:
    """Run the flow with threads (`workers`) or on an existing Dask cluster (`dask_address`)."""
    configure_prefect_env(Path(root))
    if dask_address:
        from prefect_dask import DaskTaskRunner

        runner = DaskTaskRunner(address=dask_address)
    else:
        runner = ThreadPoolTaskRunner(max_workers=workers)
    return pipeline_flow.with_options(task_runner=runner)(params_path=params_path, root=root)
