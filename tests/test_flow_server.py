"""The Prefect API a flow reports to (flow/server.py): what counts as an answering API, the watch that notices a lost
one, the record of the project's server, and which API a flow uses. The server itself, started, reused and killed
under a flow of 160 stages, is tests/test_flow_scale.py's."""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path

import pytest

from flow import server
from flow.server import ApiWatch, choose_api, healthy, project_server


class _Api(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(type(self).status)
        self.end_headers()
        self.wfile.write(b"true")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api():
    """An HTTP server on a free port answering every GET with `_Api.status`; yields (its …/api address, the server)."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/api", httpd
    httpd.shutdown()
    httpd.server_close()
    _Api.status = 200


@pytest.mark.parametrize("status, answers", [(200, True), (401, True), (404, True), (503, False), (500, False)])
def test_an_api_answers_unless_it_is_gone_or_failing(api, status, answers):
    url, _ = api
    _Api.status = status
    assert healthy(url) is answers


def test_no_server_and_a_bad_address_do_not_answer(api):
    url, httpd = api
    httpd.shutdown()
    httpd.server_close()
    assert not healthy(url, timeout=0.5)
    assert not healthy("not a url")


def test_the_watch_calls_once_after_the_api_stopped_answering_and_not_before(api):
    url, httpd = api
    lost: list[str] = []
    with ApiWatch(url, on_lost=lost.append, interval=0.05, misses=3) as watch:
        time.sleep(0.5)
        assert lost == [] and not watch.lost
        httpd.shutdown()
        httpd.server_close()
        deadline = time.monotonic() + 10
        while not watch.lost and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
    assert watch.lost and lost == [url]


def test_a_stale_record_of_the_projects_server_is_removed(tmp_path):
    home = tmp_path / ".prefect"
    home.mkdir()
    (home / server.STATE_FILE).write_text(json.dumps({"pid": 2 ** 22 + 7, "port": 1, "api_url": "http://127.0.0.1:1/api"}))
    assert project_server(tmp_path) is None and not (home / server.STATE_FILE).exists()
    assert server.stop_project_server(tmp_path) is False


def test_a_small_flow_uses_prefects_temporary_server_and_a_users_api_must_answer(api, tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert choose_api(tmp_path, server.LARGE_FLOW) is None, "not larger than LARGE_FLOW, no project server running"
    url, httpd = api
    monkeypatch.setenv("PREFECT_API_URL", url)
    assert choose_api(tmp_path, 10 * server.LARGE_FLOW) == url, "the user's API wins, large flow or not"
    httpd.shutdown()
    httpd.server_close()
    with pytest.raises(RuntimeError, match=f"PREFECT_API_URL={url}: the Prefect API does not answer"):
        choose_api(tmp_path, 1)
    assert not Path(tmp_path / ".prefect").exists()


def test_the_projects_prefect_settings_hold_in_a_process_that_imported_prefect_before(tmp_path, monkeypatch):
    """Prefect reads its environment once, at its first import; `prefect_settings` makes the project's values (and a
    PREFECT_API_URL set after that import) this process's settings while a flow runs, and puts the old ones back."""
    import prefect.settings
    from prefect.settings import get_current_settings

    from flow import configure_prefect_env
    from flow.prefect_flow import prefect_settings

    for key in ("PREFECT_HOME", "PREFECT_API_URL", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "PREFECT_LOGGING_LEVEL"):
        monkeypatch.delenv(key, raising=False)
    before = get_current_settings()
    configure_prefect_env(tmp_path)
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:1/api")
    assert get_current_settings().server.ephemeral.startup_timeout_seconds == before.server.ephemeral.startup_timeout_seconds
    with prefect_settings():
        now = get_current_settings()
        assert now.server.ephemeral.startup_timeout_seconds == 120
        assert now.home == (tmp_path / ".prefect").resolve()
        assert str(now.server.database.connection_url.get_secret_value()).endswith(str((tmp_path / ".prefect" / "prefect.db").resolve()))
        assert now.api.url == "http://127.0.0.1:1/api"
        assert prefect.settings.PREFECT_LOGGING_LEVEL.value() == "WARNING"
    assert get_current_settings().home == before.home and get_current_settings().api.url == before.api.url
