"""`cedar flow`: Prefect runs the DVC graph on a Dask cluster, only the stale stages, independent ones at once.

- `graph`: the DVC side (what is stale and in what order, starting a stage, recording it in dvc.lock);
- `cluster`: the cluster file (cluster.yaml) and the Dask cluster it describes;
- `command`: what a Dask worker runs, a stage's dvc.yaml commands;
- `server`: the Prefect API a flow reports to (the project's own server for large flows) and the watch on it;
- `prefect_flow`: the Prefect flow, its artifacts and `cedar serve`;
- `commands`: the `cedar flow`, `cedar serve`, `cedar cluster script` and `cedar server` commands.

Only `prefect_flow` imports Prefect, so `cedar flow --dry` and the no-op case answer without starting it.
"""

from __future__ import annotations

import os
from pathlib import Path

PREFECT_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_LOGGING_LEVEL": "WARNING",
}


def configure_prefect_env(root: Path) -> None:
    """Offline, project-local Prefect settings (only those the user has not set), in the environment that the
    stages, the Dask workers and Prefect's own server inherit. Call it before importing `flow.prefect_flow`; where
    Prefect was imported earlier, `flow.prefect_flow.prefect_settings` applies them to this process."""
    os.environ.setdefault("PREFECT_HOME", str((Path(root) / ".prefect").resolve()))
    for key, value in PREFECT_DEFAULTS.items():
        os.environ.setdefault(key, value)

