"""Headless Chromium driven over its DevTools pipe (no websocket, no browser-driver package): open a page, run
JavaScript in it, and collect what it printed to the console, the exceptions it threw and every request it made.

The browser tests of the report (tests/test_report_browser.py) and its load-time benchmark (bench/bench_report.py)
use it. Chromium reads DevTools commands on fd 3 and writes replies and events on fd 4, one JSON message per
NUL-terminated chunk (`--remote-debugging-pipe`).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--disable-extensions", "--mute-audio"]


@dataclass
class PageEvents:
    """What a page did since it was opened: console messages ("level: text"), uncaught exceptions and the URL of
    every request the page started (file://, data: and http(s) alike)."""

    console: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


class Browser:
    """One headless Chromium with one page. Use as a context manager; `open(path)` loads a file, `js(expr)` evaluates
    an expression (awaiting a promise) and returns its JSON value."""

    def __init__(self, width: int = 1400, height: int = 1000, timeout: float = 60.0) -> None:
        if CHROMIUM is None:
            raise FileNotFoundError("chromium is not installed (apt-get install chromium)")
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        def fds() -> None:  # the child reads commands on 3 and writes on 4 (moved out of the way first: a pipe end may be 3 or 4)
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser_r, from_browser_w)]
            for target, fd in zip((3, 4), high):
                os.dup2(fd, target, inheritable=True)

        self.process = subprocess.Popen([CHROMIUM, *FLAGS, "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
                                         f"--window-size={width},{height}", "about:blank"],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        preexec_fn=fds, close_fds=False)  # our own pipe ends are not inheritable
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self._pending: list[dict[str, Any]] = []
        self.events = PageEvents()
        self.session = ""
        target = next(t for t in self.send("Target.getTargets")["targetInfos"] if t["type"] == "page")
        self.session = self.send("Target.attachToTarget", targetId=target["targetId"], flatten=True, session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    # --- the pipe ------------------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError(f"chromium did not answer within {self.timeout} s")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise ConnectionError("chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _record(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.events.console.append(f"{params.get('type')}: {text}")
        elif method == "Log.entryAdded":
            entry = params["entry"]
            self.events.console.append(f"{entry.get('level')}: {entry.get('text')} {entry.get('url', '')}".strip())
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.events.exceptions.append(details.get("exception", {}).get("description") or details.get("text", ""))
        elif method == "Network.requestWillBeSent":
            self.events.requests.append(params["request"]["url"])
        self._pending.append(message)

    def send(self, method: str, session: bool = True, **params: Any) -> dict[str, Any]:
        """Send one DevTools command (to the page's session unless session=False) and return its result."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._record(reply)

    def wait_for(self, method: str) -> dict[str, Any]:
        """The next event named `method` (one that already arrived counts)."""
        deadline = time.monotonic() + self.timeout
        while True:
            for i, message in enumerate(self._pending):
                if message.get("method") == method:
                    del self._pending[: i + 1]
                    return message.get("params", {})
            self._pending.clear()
            self._record(self._read_message(deadline))

    # --- the page ------------------------------------------------------------------------------
    def open(self, path: Path) -> float:
        """Load `path` and wait for its load event; returns the seconds from navigation start to the end of the load
        event (performance.timing: parsing, every inline script and the images)."""
        self.events = PageEvents()
        self._pending.clear()
        self.send("Page.navigate", url=Path(path).resolve().as_uri())
        self.wait_for("Page.loadEventFired")
        return self.js("new Promise(r => setTimeout(() => r((performance.timing.loadEventEnd - performance.timing.navigationStart) / 1000), 0))")

    def js(self, expression: str) -> Any:
        """Evaluate `expression` in the page (a promise is awaited); its value as JSON. A thrown error fails."""
        result = self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise RuntimeError(f"{expression[:80]}: {details.get('exception', {}).get('description') or details.get('text')}")
        return result["result"].get("value")

    def click(self, selector: str, index: int = 0, wait: float = 0.5) -> None:
        """A real mouse click (pressed and released) at the centre of the `index`-th element matching `selector`,
        scrolled into view first; then `wait` seconds for the page to react (plotly delays a legend click to tell it
        from a double click)."""
        box = self.js(f"""(e => {{ e.scrollIntoView({{block: 'center'}}); const b = e.getBoundingClientRect();
            return [b.x + b.width / 2, b.y + b.height / 2]; }})(document.querySelectorAll({json.dumps(selector)})[{index}])""")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left" if kind != "mouseMoved" else "none",
                      clickCount=1 if kind != "mouseMoved" else 0)
        time.sleep(wait)

    def screenshot(self, path: Path, full_page: bool = False) -> None:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            params["clip"] = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}

        Path(path).write_bytes(base64.b64decode(self.send("Page.captureScreenshot", **params)["data"]))

    def close(self) -> None:
        try:
            self.send("Browser.close", session=False)
        except (TimeoutError, ConnectionError, OSError, RuntimeError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
