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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PREFECT_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_LOGGING_LEVEL": "WARNING",
}


def configure_prefect_env(root: Path) -> None:
    """Offline, project-local Prefect settings (only those the user has not set), in the environment that the
    stages, the Dask workers and Prefect's own server inherit."""
    os.environ.setdefault("PREFECT_HOME", str((Path(root) / ".prefect").resolve()))
    for key, value in PREFECT_DEFAULTS.items():
        os.environ.setdefault(key, value)


@contextmanager
def prefect_settings() -> Iterator[None]:
    """The environment's Prefect variables (`configure_prefect_env`, PREFECT_API_URL) as this process's Prefect
    settings while the block runs. Prefect reads its environment once, when it is first imported: a process that
    imported it earlier (a notebook, the test suite) would otherwise keep its own home, API and the temporary
    server's 20-second start-up limit (seen: a flow on a loaded CI machine failed at 20 s)."""
    import prefect.settings

    keys = ["PREFECT_HOME", "PREFECT_API_URL", *PREFECT_DEFAULTS]
    updates = {getattr(prefect.settings, key): os.environ[key] for key in keys if key in os.environ and hasattr(prefect.settings, key)}
    with prefect.settings.temporary_settings(updates):
        yield
