"""The Prefect API a flow reports to: the project's own Prefect server for large flows, and a watch on the API.

Prefect's temporary server (started inside the flow's process when no PREFECT_API_URL is set) is meant for small
flows; a sweep of a hundred stages or more runs for an hour and its temporary server was seen to exit in the
middle. So a flow of more than `LARGE_FLOW` stages runs against the project's server: `prefect server start` in
the background, its database and log in the project's `.prefect/` (which git ignores), started once and reused
by every later flow of the project, large or small, until `cedar server stop`. `cedar server start` starts it
ahead (its UI then shows every flow of the project); `cedar server status` prints its address. A PREFECT_API_URL
set by the user always wins.

If the API is lost anyway, the stages do not need it: the flow's tasks keep their states in the flow's process
(Prefect's client-side orchestration) and the driver records finished stages in dvc.lock itself. `ApiWatch` asks
the API's health endpoint every second; once it has failed a few times in a row the flow says so in one line,
silences Prefect's retrying clients, lets the running and waiting stages finish and record, and exits without
waiting for an API that is gone (`flow.prefect_flow`).

Only the standard library is imported here: the flow decides which API to use before Prefect is imported.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

#: flows of more stages than this run against the project's Prefect server, not Prefect's temporary one
LARGE_FLOW = 50
#: where the project's server is recorded (its pid, port and API address), beside its database
STATE_FILE = "server.json"


def prefect_home(root: Path) -> Path:
    """The project's Prefect folder (`flow.configure_prefect_env` points PREFECT_HOME at it)."""
    return Path(root).resolve() / ".prefect"


def healthy(api_url: str, timeout: float = 2.0) -> bool:
    """Whether the Prefect API at `api_url` (…/api) answers its health check: any answer but a server error counts
    (a hosted API may want credentials for it); no connection, a timeout or a 5xx does not."""
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout) as response:
            return response.status < 500
    except urllib.error.HTTPError as e:
        return e.code < 500
    except (OSError, ValueError):
        return False


def _state(root: Path) -> dict | None:
    try:
        state = json.loads((prefect_home(root) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and {"pid", "port", "api_url"} <= set(state) else None


def _ours(pid: int, port: int) -> bool:
    """Whether process `pid` is still a Prefect server on `port` (not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        if sys.platform.startswith("linux"):
            return False
        try:  # elsewhere: only whether the pid lives
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    return b"prefect" in b" ".join(cmdline) and str(port).encode() in cmdline


def project_server(root: Path) -> str | None:
    """The API address of the project's running server, or None (a stale record is removed)."""
    state = _state(root)
    if state is None:
        return None
    if _ours(state["pid"], state["port"]) and healthy(state["api_url"]):
        return state["api_url"]
    if not _ours(state["pid"], state["port"]):
        (prefect_home(root) / STATE_FILE).unlink(missing_ok=True)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_project_server(root: Path, timeout: float = 180.0) -> str:
    """Start the project's Prefect server in the background (its own session: it outlives this process and a
    Ctrl-C of it) and wait until it answers; returns its API address. RuntimeError with its log's tail when it
    does not come up within `timeout` seconds."""
    running = project_server(root)
    if running is not None:
        return running
    home = prefect_home(root)
    home.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}
    env.pop("PREFECT_API_URL", None)
    log = home / "server.log"
    with open(log, "ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=home)
    api_url = f"http://127.0.0.1:{port}/api"
    (home / STATE_FILE).write_text(json.dumps({"pid": process.pid, "port": port, "api_url": api_url}))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if healthy(api_url):
            return api_url
        time.sleep(0.5)
    stop_project_server(root)
    tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-5:])
    raise RuntimeError(f"the project's Prefect server did not start within {timeout:.0f} s (log {log}: {tail})")


def stop_project_server(root: Path, timeout: float = 30.0) -> bool:
    """Stop the project's server (SIGTERM, then SIGKILL after `timeout` s); False when none was running."""
    state = _state(root)
    (prefect_home(root) / STATE_FILE).unlink(missing_ok=True)
    if state is None or not _ours(state["pid"], state["port"]):
        return False
    try:
        os.kill(state["pid"], signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _ours(state["pid"], state["port"]):
            time.sleep(0.2)
        if _ours(state["pid"], state["port"]):
            os.kill(state["pid"], signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


class ApiWatch:
    """Asks the Prefect API at `api_url` for its health every `interval` seconds in a daemon thread; after
    `misses` failures in a row it sets `lost` and calls `on_lost(api_url)` once. A context manager: the thread
    stops on exit."""

    def __init__(self, api_url: str, on_lost: Callable[[str], None], interval: float = 1.0, misses: int = 3):
        self.api_url, self.on_lost, self.interval, self.misses = api_url, on_lost, interval, misses
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prefect-api-watch", daemon=True)

    def _run(self) -> None:
        failures = 0
        while not self._stop.wait(self.interval):
            failures = 0 if healthy(self.api_url, timeout=self.interval * 2) else failures + 1
            if failures >= self.misses:
                self.lost = True
                self.on_lost(self.api_url)
                return

    def __enter__(self) -> "ApiWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def choose_api(root: Path, stages: int) -> str | None:
    """The Prefect API a flow of `stages` stages reports to, set as PREFECT_API_URL: the user's PREFECT_API_URL
    (RuntimeError when it does not answer), else the project's server when it runs or when the flow is larger than
    `LARGE_FLOW` (then started, with a line saying so); None: Prefect's temporary server."""
    url = os.environ.get("PREFECT_API_URL")
    if url:
        if not healthy(url, timeout=10):
            raise RuntimeError(f"PREFECT_API_URL={url}: the Prefect API does not answer (start that server, or unset the variable)")
        return url
    url = project_server(root)
    if url is None and stages > LARGE_FLOW:
        url = start_project_server(root)
        print(f"Started this project's Prefect server for a flow of {stages} stages: {url.removesuffix('/api')} (its UI; it stays up for "
              "later flows, `cedar server stop` stops it)", flush=True)
    if url is not None:
        os.environ["PREFECT_API_URL"] = url
    return url
