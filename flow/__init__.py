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


def configure_prefect_env(root: Path) -> None:
    """Offline, project-local Prefect settings (only those the user has not set). Prefect reads its settings when
    it is imported: call this before importing `flow.prefect_flow`."""
    defaults = {
        "PREFECT_HOME": str((Path(root) / ".prefect").resolve()),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
